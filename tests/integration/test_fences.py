"""PostgreSQL fences composed with the server's timeline (docs/how-to/high-availability.md): at
least (timeline - 1) << 32, read in the claim's own statement; unchanged on timeline 1; and a claim
that never fails for a server that cannot read its timeline (Aurora, CockroachDB).

The server's own functions are shadowed here by functions of the test's schema, put before
pg_catalog in its search_path: a timeline of our choosing, or Aurora's refusal. A real
failover (timeline 2 after a promotion) is tests/integration/test_failover.py's.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from helpers import run_once
from ledger_sql import query


def _shadowing(url: str, function: str) -> str:
    """The URL with pg_walfile_name(pg_lsn) replaced, for its sessions, by `function`'s body
    (plpgsql), created in the test's schema and searched before pg_catalog."""
    schema = url.rpartition("search_path%3D")[2]
    query(url, f"CREATE FUNCTION {schema}.pg_walfile_name(pg_lsn) RETURNS text "
               f"LANGUAGE plpgsql AS $$ BEGIN {function} END $$")
    return url.replace(f"search_path%3D{schema}",
                       "search_path%3D" + quote(f"{schema},pg_catalog"))


def _fences(env: dict[str, str], url: str, job: str, *lags: int) -> list[int]:
    """The ONCE_FENCE of a `once run` of each lag (a day back each), through url."""
    fences = []
    for lag in lags:
        done = run_once("run", "--job", job, "--every", "day", "--lag", str(lag), "--", "sh",
                        "-c", 'echo "$ONCE_FENCE"', env={**env, "ONCE_DATABASE_URL": url})
        assert done.returncode == 0, done.stderr
        fences.append(int(done.stdout))
    return fences


def test_fences_are_unchanged_on_a_server_never_promoted(pg_url: str,
                                                         once_env: dict[str, str]) -> None:
    assert query(pg_url, "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)") == [
        ("00000001",)]
    assert _fences(once_env, pg_url, "t1", 1, 2, 3) == [1, 2, 3]


def test_a_later_timeline_hands_out_larger_fences(pg_url: str, once_env: dict[str, str]) -> None:
    before = _fences(once_env, pg_url, "j", 1, 2)  # timeline 1: 1, 2
    # Timeline 3 (two promotions later): every fence above every fence of timelines 1 and 2.
    url = _shadowing(pg_url, "RETURN '000000030000000000000007';")
    after = _fences(once_env, url, "j", 3, 4)
    assert before == [1, 2]
    assert after == [2 << 32, (2 << 32) + 1]
    # A new job on that timeline starts there too; back on a lower timeline (a dump restored
    # to a new cluster), fences still grow: never below the job's counter plus one.
    assert _fences(once_env, url, "new", 1) == [2 << 32]
    assert _fences(once_env, pg_url, "j", 5) == [(2 << 32) + 2]


def test_the_largest_timeline_does_not_overflow(pg_url: str, once_env: dict[str, str]) -> None:
    url = _shadowing(pg_url, "RETURN 'FFFFFFFF0000000000000001';")
    assert _fences(once_env, url, "big", 1, 2) == [(2**31 - 1) << 32, ((2**31 - 1) << 32) + 1]


@pytest.mark.parametrize("refusal", [
    # Aurora: the function exists and refuses
    "RAISE EXCEPTION 'Function pg_current_wal_lsn() is currently not supported for Aurora' "
    "USING ERRCODE = 'feature_not_supported';",
    "RAISE EXCEPTION 'wal_level must be set to ''logical''' "
    "USING ERRCODE = 'object_not_in_prerequisite_state';",
    "RAISE EXCEPTION 'permission denied for function pg_walfile_name' "
    "USING ERRCODE = 'insufficient_privilege';",
    "RETURN 'not hex at all';",  # a value the cast refuses
])
def test_a_server_that_cannot_read_its_timeline_still_claims(
        pg_url: str, once_env: dict[str, str], refusal: str) -> None:
    url = _shadowing(pg_url, refusal)
    assert _fences(once_env, url, "plain", 1, 2, 3) == [1, 2, 3]
    assert query(pg_url, "SELECT status, count(*) FROM once_runs GROUP BY status") == [
        ("done", 3)]
