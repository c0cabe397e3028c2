"""Bad input on every backend: one `once:` line, a documented status, nothing half-done.

Each test is one of the inputs that used to end in a traceback, an exit 75 no retry could
cure, a ledger later commands could not read, or a silent wrong answer.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import once
from helpers import run_either
from ledger_sql import query, tables

DAY = ["--every", "day"]


def one_line(result: Any, status: int) -> str:
    """The single `once:` line of a refused command (and no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == status, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("once: "), result.stderr
    return str(lines[0])


def run(*args: str, env: dict[str, str], marker: Path) -> Any:
    """`once run ... -- touch MARKER`."""
    return run_either("run", *args, "--", "touch", str(marker), env=env)


# -- 1. ?charset= in a MySQL/MariaDB URL -------------------------------------------------------


def test_charset_in_a_mysql_url_works(once_env: dict[str, str], ledger_url: str,
                                      tmp_path: Path) -> None:
    if not ledger_url.startswith(("mysql", "mariadb")):
        pytest.skip("?charset= is a MySQL/MariaDB URL parameter")
    env = {**once_env, "ONCE_DATABASE_URL": ledger_url + "?charset=utf8mb4"}
    done = run("--job", "cs", *DAY, env=env, marker=tmp_path / "ran")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()
    for report in (["status"], ["check"], ["history", "cs"], ["metrics"],
                   ["prune", "--older-than", "1d"]):
        result = run_either(*report, env=env)
        assert result.returncode == 0, (report, result.stderr)
    refused = run("--job", "cs", *DAY, env={**env, "ONCE_DATABASE_URL": ledger_url
                                            + "?charset=latin1"}, marker=tmp_path / "x")
    assert "charset" in one_line(refused, 2)


# -- 3. secret files that are not UTF-8, empty or huge ----------------------------------------


@pytest.mark.parametrize("content", [b"\xff\xfe\x00pw", b"", b"x" * (1 << 20)],
                         ids=["binary", "empty", "huge"])
def test_a_bad_secret_file_is_a_usage_error(once_env: dict[str, str], ledger_url: str,
                                            tmp_path: Path, content: bytes) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(content)
    password = run("--job", "s", *DAY, "--db-password-file", str(secret), env=once_env,
                   marker=tmp_path / "ran")
    assert "--db-password-file" in one_line(password, 2)
    env = {k: v for k, v in once_env.items() if k != "ONCE_DATABASE_URL"}
    env["ONCE_DATABASE_URL_FILE"] = str(secret)
    for args in (["run", "--job", "s", *DAY, "--", "touch", str(tmp_path / "ran")],
                 ["status"], ["check"], ["prune", "--older-than", "1d"], ["schema"]):
        result = run_either(*args, env=env)
        assert "ONCE_DATABASE_URL_FILE" in one_line(result, 2), args
    assert not (tmp_path / "ran").exists()
    assert not tables(ledger_url)
    assert not (tmp_path / "state").exists(), "the default ledger was used instead"


# -- 4. malformed hosts in a URL --------------------------------------------------------------


@pytest.mark.parametrize("url", ["postgresql://u:secret@[::1/x", "postgresql://[zz]/x",
                                 "mariadb://u:secret@[::1/x", "mysql://[zz]:3306/x"])
def test_a_malformed_host_is_a_usage_error(tmp_path: Path, url: str) -> None:
    # No backend: the URL is refused before any connection.
    once_env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    once_env["XDG_STATE_HOME"] = str(tmp_path / "state")
    for args in (["run", "--job", "h", *DAY, "--db", url, "--", "touch", str(tmp_path / "r")],
                 ["catchup", "--job", "h", *DAY, "--db", url, "--since", "2026-01-01",
                  "--", "true"],
                 ["status", "--db", url], ["check", "--db", url], ["metrics", "--db", url],
                 ["history", "h", "--db", url], ["prune", "--older-than", "1d", "--db", url],
                 ["schema", "--db", url]):
        line = one_line(run_either(*args, env=once_env), 2)
        assert "bad host" in line and "secret" not in line, (args, line)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("url", ["mariadb://root@:/x", "postgresql://u@host:/x",
                                 "postgresql://u@host:port/x", "mysql://u@[::1]:0/x",
                                 "mysql://u@h:99999/x"])
def test_a_bad_port_is_a_usage_error_for_every_command(tmp_path: Path, url: str) -> None:
    # torture (bad input: URLs): the reports read the URL with SQLAlchemy, which failed on
    # an empty or non-numeric port with a traceback.
    once_env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    once_env["XDG_STATE_HOME"] = str(tmp_path / "state")
    for args in (["run", "--job", "h", *DAY, "--db", url, "--", "touch", str(tmp_path / "r")],
                 ["status", "--db", url], ["check", "--db", url], ["metrics", "--db", url],
                 ["history", "h", "--db", url], ["logs", "h", "--db", url],
                 ["prune", "--older-than", "1d", "--db", url], ["state", "h", "--db", url]):
        assert "bad port" in one_line(run_either(*args, env=once_env), 2), args
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("query", ["connect_timeout=abc", "connect_timeout=0",
                                   "ssl_ca=/nonexistent", "ssl_key=x&ssl_cert=y"])
def test_a_mysql_query_the_driver_cannot_use_is_a_usage_error(tmp_path: Path,
                                                              query: str) -> None:
    # torture (bad input: URLs): the reports handed these to PyMySQL through SQLAlchemy,
    # which failed with a traceback (int('abc'), FileNotFoundError) for every report.
    once_env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    once_env["XDG_STATE_HOME"] = str(tmp_path / "state")
    url = f"mariadb://root@127.0.0.1:1/x?{query}"
    for args in (["run", "--job", "h", *DAY, "--db", url, "--", "touch", str(tmp_path / "r")],
                 ["status", "--db", url], ["check", "--db", url], ["metrics", "--db", url],
                 ["history", "h", "--db", url], ["logs", "h", "--db", url],
                 ["prune", "--older-than", "1d", "--db", url]):
        line = one_line(run_either(*args, env=once_env), 2)
        assert query.partition("=")[0] in line, (args, line)
    assert not (tmp_path / "r").exists()


def test_a_mysql_ssl_file_that_is_no_certificate_is_one_line_and_75(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    if not ledger_url.startswith(("mysql", "mariadb")):
        pytest.skip("?ssl_ca= is a MySQL/MariaDB URL parameter")
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    url = f"{ledger_url}?ssl_ca={bogus}"
    for args in (["status"], ["check"], ["metrics"], ["history", "h"],
                 ["prune", "--older-than", "1d"], ["run", "--job", "h", *DAY, "--", "true"]):
        result = run_either(args[0], "--db", url, *args[1:], env=once_env)
        assert result.returncode == 75, (args, url, result.returncode, result.stderr)
        one_line(result, 75)


# -- 5. the stored name's length, the same on every backend -----------------------------------


def test_namespace_and_job_fit_the_key_column_or_are_refused(once_env: dict[str, str],
                                                             ledger_url: str,
                                                             tmp_path: Path) -> None:
    namespace, job = "n" * 200, "j" * 54  # 200 + 1 + 54 = 255: the column's width
    fits = run("--job", job, "--namespace", namespace, *DAY, env=once_env,
               marker=tmp_path / "fits")
    assert fits.returncode == 0, fits.stderr
    assert query(ledger_url, "SELECT job FROM once_runs") == [(f"{namespace}:{job}",)]
    for name in ("j" * 55, "j" * 200):
        refused = run("--job", name, "--namespace", namespace, *DAY, env=once_env,
                      marker=tmp_path / "refused")
        assert "at most 255" in one_line(refused, 2)
        for args in (["state", name, "--namespace", namespace, "--set", "x"],
                     ["history", name, "--namespace", namespace],
                     ["rerun", "--job", name, "--namespace", namespace, "--period",
                      "2026-01-01", "--", "true"]):
            assert "at most 255" in one_line(run_either(*args, env=once_env), 2), args
    assert not (tmp_path / "refused").exists()
    assert len(query(ledger_url, "SELECT job FROM once_jobs")) == 1


# -- 12. the Python API refuses what the command line refuses ---------------------------------


@pytest.mark.parametrize("job, kwargs", [
    ("", {}), ("nightly report", {}), ("esc\x1b[2Jape", {}), ("x" * 201, {}),
    ("j" * 55, {"namespace": "n" * 200}), ("ok", {"namespace": "bad ns"}),
    ("ok", {"stale_after": 0}), ("ok", {"stale_after": -5}), ("ok", {"stale_after": 1e12}),
    ("ok", {"lag": -1}), ("ok", {"max_attempts": 0}), ("ok", {"max_clock_skew": -1}),
    ("ok", {"cron": ",".join(str(m % 60) for m in range(120)) + " * * * *", "every": None}),
    # What only Python can pass: the wrong type, a period past the year 9999.
    (5, {}), ("ok", {"tz": 5}), ("ok", {"every": 5}), ("ok", {"db": 5}),
    ("ok", {"now": "2026-01-01"}), ("ok", {"stale_after": "5m"}), ("ok", {"lag": True}),
    ("ok", {"now": datetime(9999, 12, 31, 23, tzinfo=UTC)}),
    ("ok", {"every": "minute", "lag": 1000, "now": datetime(1, 1, 1, tzinfo=UTC)}),
], ids=repr)
def test_the_python_api_refuses_what_the_cli_refuses(ledger_url: str, job: str,
                                                     kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"every": "day", "db": ledger_url, **kwargs}
    with pytest.raises(ValueError), once.claim(job, **args):  # InputError or SpecError
        raise AssertionError("the block ran")
    assert not tables(ledger_url)


def test_the_python_api_refuses_a_bad_once_owner(ledger_url: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCE_OWNER", "pod\nOK forged")
    with pytest.raises(once.InputError), once.claim("api-owner", every="day", db=ledger_url):
        raise AssertionError("the block ran")
    assert not tables(ledger_url)


# -- 13. ONCE_OWNER, --reason and --cron that no column can hold ------------------------------


@pytest.mark.parametrize("owner", ["pod-\udcff", "pod\nOK x 1 jobs", "\x1b]0;pwned\x07",
                                   "o" * 256], ids=["not-utf8", "newline", "escape", "long"])
def test_a_bad_once_owner_is_a_usage_error(once_env: dict[str, str], ledger_url: str,
                                           tmp_path: Path, owner: str) -> None:
    env = {**once_env, "ONCE_OWNER": owner}
    for args in (["run", "--job", "o", *DAY, "--", "touch", str(tmp_path / "ran")],
                 ["catchup", "--job", "o", *DAY, "--since", "2026-01-01", "--", "true"],
                 ["rerun", "--job", "o", "--period", "2026-01-01", "--", "true"],
                 ["state", "o", "--set", "1"]):
        assert "ONCE_OWNER" in one_line(run_either(*args, env=env), 2), args
    assert not (tmp_path / "ran").exists()
    assert not tables(ledger_url)
    fits = run("--job", "o", *DAY, env={**once_env, "ONCE_OWNER": "ö" * 255},
               marker=tmp_path / "fits")
    assert fits.returncode == 0, fits.stderr
    assert query(ledger_url, "SELECT owner FROM once_runs") == [("ö" * 255,)]


def test_a_reason_that_is_not_utf8_is_a_usage_error(once_env: dict[str, str],
                                                    ledger_url: str, tmp_path: Path) -> None:
    assert run("--job", "r", *DAY, env=once_env, marker=tmp_path / "first").returncode == 0
    key = query(ledger_url, "SELECT period FROM once_runs")[0][0]
    for reason in ("late \udcff file", "x" * 1001):
        refused = run_either("rerun", "--job", "r", "--period", key, "--reason", reason, "--",
                           "touch", str(tmp_path / "again"), env=once_env)
        assert "--reason" in one_line(refused, 2)
    assert not (tmp_path / "again").exists()
    assert query(ledger_url, "SELECT count(*) FROM once_attempts") == [(1,)]
    fine = run_either("rerun", "--job", "r", "--period", key, "--reason", "late bank file ✓",
                    "--", "true", env=once_env)
    assert fine.returncode == 0, fine.stderr


def test_a_cron_expression_longer_than_its_column_is_a_usage_error(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    minutes = ",".join(str(m % 60) for m in range(120))  # 289 characters, a valid field
    refused = run("--job", "c", "--cron", f"{minutes} * * * *", env=once_env,
                  marker=tmp_path / "ran")
    assert "--cron" in one_line(refused, 2)
    assert not (tmp_path / "ran").exists()
    assert not tables(ledger_url)


# -- 2. prune against a ledger without tables, or one that cannot be reached ------------------


def test_prune_without_tables_says_so_and_creates_nothing(once_env: dict[str, str],
                                                          ledger_url: str,
                                                          tmp_path: Path) -> None:
    for dry in ([], ["--dry-run"]):
        result = run_either("prune", "--older-than", "30d", *dry, env=once_env)
        assert "nothing to prune" in one_line(result, 0)
        assert result.stdout.endswith("0 done rows, 0 attempts and 0 lead terms\n")
    assert not tables(ledger_url)
    if ledger_url.startswith("sqlite"):
        assert not Path(ledger_url.partition(":///")[2]).exists(), "an empty .db was left"
        empty = tmp_path / "empty.db"
        empty.touch()
        result = run_either("prune", "--older-than", "30d", "--db", f"sqlite:///{empty}",
                          env=once_env)
        assert "nothing to prune" in one_line(result, 0)


def test_prune_against_an_unreachable_ledger_is_one_line_and_75(once_env: dict[str, str],
                                                                ledger_url: str,
                                                                tmp_path: Path) -> None:
    if ledger_url.startswith("sqlite"):  # a file SQLite cannot read (a directory is exit 2)
        (tmp_path / "garbage.db").write_bytes(b"not a database " * 512)
        url = f"sqlite:///{tmp_path}/garbage.db"
    else:
        scheme = ledger_url.partition("://")[0]
        url = f"{scheme}://nobody@127.0.0.1:1/nowhere"
    result = run_either("prune", "--older-than", "30d", "--db", url, env=once_env)
    assert "cannot prune the ledger" in one_line(result, 75)


# -- 8. prune leaves every period claimable -----------------------------------------------------


def test_a_pruned_period_whose_attempt_was_taken_over_can_be_claimed_again(
        once_env: dict[str, str], ledger_url: str) -> None:
    args = ["catchup", "--job", "p", *DAY, "--since", "2026-01-01", "--until", "2026-01-03",
            "-q", "--", "true"]
    assert run_either(*args, env=once_env).returncode == 0
    # 2026-01-01 as a takeover leaves it: attempt 1 never finished, attempt 2 did.
    query(ledger_url, "UPDATE once_runs SET attempt = 2 WHERE period = '2026-01-01'")
    query(ledger_url, "UPDATE once_attempts SET attempt = 2 WHERE period = '2026-01-01'")
    query(ledger_url, "INSERT INTO once_attempts (job, period, attempt, fence, owner, status, "
                      "started_at, claim_id) SELECT job, period, 1, fence, owner, 'running', "
                      "started_at, 'taken-over-1' FROM once_runs WHERE period = '2026-01-01'")
    # Finished long ago by the database's own clock.
    query(ledger_url, "UPDATE once_runs SET finished_at = period_start")
    query(ledger_url, "UPDATE once_attempts SET finished_at = started_at - "
          + ("INTERVAL '400 days'" if ledger_url.startswith("postgresql") else
             "INTERVAL 400 DAY" if ledger_url.startswith(("mariadb", "mysql")) else "0")
          + " WHERE finished_at IS NOT NULL")
    if ledger_url.startswith("sqlite"):
        query(ledger_url, "UPDATE once_attempts SET finished_at = '2025-01-01 00:00:00.000000' "
                          "WHERE finished_at IS NOT NULL")
    dry = run_either("prune", "--older-than", "30d", "--dry-run", env=once_env)
    assert dry.stdout.startswith("would delete 2 done rows, 4 attempts and 0 lead terms"), \
        dry.stdout
    pruned = run_either("prune", "--older-than", "30d", env=once_env)
    assert pruned.stdout.startswith("deleted 2 done rows, 4 attempts and 0 lead terms"), \
        pruned.stdout
    assert query(ledger_url, "SELECT count(*) FROM once_attempts") == [(0,)]
    again = run_either("catchup", "--job", "p", *DAY, "--since", "2026-01-01", "--until",
                     "2026-01-01", "--", "true", env=once_env)
    assert again.returncode == 0, again.stderr
    assert query(ledger_url, "SELECT status, attempt FROM once_runs "
                             "WHERE period = '2026-01-01'") == [("done", 1)]
    history = run_either("history", "p", "--json", env=once_env)
    assert history.returncode == 0 and '"2026-01-01"' in history.stdout, history.stderr


# -- 6. periods that have not begun -----------------------------------------------------------


def test_catchup_and_rerun_refuse_a_period_that_has_not_begun(once_env: dict[str, str],
                                                              ledger_url: str,
                                                              tmp_path: Path) -> None:
    today = datetime.now(UTC).date()
    past, future = str(today - timedelta(days=3)), str(today + timedelta(days=2))
    # Up to now: fine.
    assert run_either("catchup", "--job", "f", *DAY, "--since", past, "-q", "--", "true",
                    env=once_env).returncode == 0
    done = query(ledger_url, "SELECT count(*) FROM once_runs")[0][0]
    ran = tmp_path / "ran"
    for args in (["catchup", "--job", "f", *DAY, "--since", past, "--until", future],
                 ["catchup", "--job", "f", *DAY, "--since", future, "--until", future],
                 ["catchup", "--job", "f", *DAY, "--since", past, "--until", "9999-12-30"],
                 ["rerun", "--job", "f", "--period", future]):
        refused = run_either(*args, "--", "touch", str(ran), env=once_env)
        assert "has not begun" in one_line(refused, 2), args
    assert not ran.exists()
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(done,)]
    # Ahead of time only when asked for.
    ahead = run_either("catchup", "--job", "f", *DAY, "--since", past, "--until", future,
                     "--allow-future", "-q", "--", "true", env=once_env)
    assert ahead.returncode == 0, ahead.stderr
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(6,)]
    again = run_either("rerun", "--job", "f", "--period", future, "--allow-future", "--",
                     "true", env=once_env)
    assert again.returncode == 0, again.stderr


# -- 7. periods before the year 1000 ----------------------------------------------------------

def reports(job: str) -> list[list[str]]:
    return [["status"], ["status", "--json"], ["status", job, "--timeline"], ["check"],
            ["check", "--json"], ["metrics"], ["history", job], ["history", job, "--json"]]


def reports_read(env: dict[str, str], job: str = "r") -> None:
    """Every report reads the whole ledger: no traceback, a documented status."""
    for args in reports(job):
        result = run_either(*args, env=env)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        assert result.returncode in ((0, 1, 2) if args[0] == "check" else (0,)), (
            args, result.stderr)


def test_periods_before_the_year_1000_are_stored_alike_and_read_back(
        once_env: dict[str, str], ledger_url: str) -> None:
    assert run_either("run", "--job", "r", *DAY, "--", "true", env=once_env).returncode == 0
    for key in ("0001-01-01", "0999-12-31", "0100-06-15"):
        again = run_either("rerun", "--job", "r", "--period", key, "--", "true", env=once_env)
        assert again.returncode == 0, again.stderr
    starts = dict(query(ledger_url, "SELECT period, period_start FROM once_runs"))
    if ledger_url.startswith("sqlite"):  # text: four-digit years, as SQLAlchemy writes them
        assert starts["0001-01-01"] == "0001-01-01 00:00:00.000000", starts
        assert starts["0999-12-31"] == "0999-12-31 00:00:00.000000", starts
    reports_read(once_env)
    # The latest done period is today's, not one of the years 100-999 (which sorted after
    # 2026 when unpadded), and the first is the year 1's.
    _latest_and_first_are(once_env, "0001-01-01")


def test_a_year_an_earlier_version_wrote_unpadded_is_read_and_repaired(
        once_env: dict[str, str], ledger_url: str) -> None:
    if not ledger_url.startswith("sqlite"):
        pytest.skip("only SQLite stored times as text with strftime's unpadded year")
    assert run_either("run", "--job", "r", *DAY, "--", "true", env=once_env).returncode == 0
    assert run_either("rerun", "--job", "r", "--period", "0999-12-31", "--", "true",
                    env=once_env).returncode == 0
    for column, value in (("period_start", "999-12-31 00:00:00.000000"),
                          ("period_end", "1000-01-01 00:00:00.000000")):
        query(ledger_url, f"UPDATE once_runs SET {column} = ? WHERE period = '0999-12-31'",
              (value,))
    query(ledger_url, "UPDATE once_jobs SET first_period_start = '999-12-31 00:00:00.000000'")
    reports_read(once_env)
    assert run_either("schema", env=once_env).returncode == 0
    assert query(ledger_url, "SELECT period_start FROM once_runs WHERE period = "
                             "'0999-12-31'") == [("0999-12-31 00:00:00.000000",)]
    assert query(ledger_url, "SELECT first_period_start FROM once_jobs") == [
        ("0999-12-31 00:00:00.000000",)]
    _latest_and_first_are(once_env, "0999-12-31")


def _latest_and_first_are(once_env: dict[str, str], first: str) -> None:
    status = run_either("status", "--json", env=once_env)
    (job,) = json.loads(status.stdout)
    today = datetime.now(UTC).date().isoformat()
    assert (job["last_done"], job["first_period"]) == (today, first), job
    # Catch-up starts at the oldest gap, the day after the first period.
    dry = run_either("catchup", "--job", "r", *DAY, "--dry-run", "--max", "1", env=once_env)
    assert dry.returncode == 0, dry.stderr
    after = datetime.strptime(first, "%Y-%m-%d").date() + timedelta(days=1)
    assert dry.stdout.split()[0] == f"{after.year:04d}-{after:%m-%d}", dry.stdout


# -- 9. seeding a watermark before the first run ---------------------------------------------


@pytest.mark.slow
def test_a_watermark_can_be_seeded_before_the_job_first_runs(once_env: dict[str, str],
                                                             ledger_url: str,
                                                             tmp_path: Path) -> None:
    # Typo protection: a job that has never run needs its schedule to be set.
    refused = run_either("state", "seeded", "--set", "2026-01-01", env=once_env)
    assert "--every or --cron" in one_line(refused, 2)
    assert "--set" in one_line(run_either("state", "seeded", *DAY, env=once_env), 2)
    assert "unknown job" in one_line(run_either("state", "seeded", env=once_env), 2)
    # Seeded on a ledger without tables: they are created, the job registered, no fire.
    seeded = run_either("state", "seeded", "--set", "2026-01-01", *DAY, "--tz",
                      "Europe/Berlin", env=once_env)
    assert "registered until its first run" in one_line(seeded, 0)
    assert run_either("state", "seeded", env=once_env).stdout == "2026-01-01\n"
    assert query(ledger_url, "SELECT fence, fire_count, schedule, tz FROM once_jobs") == [
        (0, 0, "day", "Europe/Berlin")]
    reports_read(once_env, "seeded")
    check = run_either("check", "seeded", env=once_env)  # not due before its first fire
    assert check.returncode == 0 and check.stdout.startswith("OK 1 job"), check.stdout
    # The first run starts from the seed, takes fence 1 and its own schedule.
    got = tmp_path / "got"
    first = run_either("run", "--job", "seeded", "--every", "hour", "--state", "--", "sh", "-c",
                     f'printf %s "$ONCE_STATE" > {got}; echo 2026-02-01 > "$ONCE_STATE_OUT"',
                     env=once_env)
    assert first.returncode == 0, first.stderr
    assert got.read_text() == "2026-01-01"
    assert query(ledger_url, "SELECT fence, fire_count, schedule, tz FROM once_jobs") == [
        (1, 1, "hour", "UTC")]
    # A job that has run keeps its schedule: a seed's options then change nothing but the value.
    again = run_either("state", "seeded", "--set", "x", "--cron", "0 3 * * *", env=once_env)
    assert "registered" not in one_line(again, 0)
    assert query(ledger_url, "SELECT schedule, state FROM once_jobs") == [("hour", "x")]
    reports_read(once_env, "seeded")
    # A cron schedule and a namespace seed alike.
    cron = run_either("state", "c", "--namespace", "ns", "--set", "7", "--cron", "0 3 * * *",
                    env=once_env)
    assert cron.returncode == 0, cron.stderr
    assert run_either("state", "ns:c", env=once_env).stdout == "7\n"
    reports_read(once_env, "ns:c")
