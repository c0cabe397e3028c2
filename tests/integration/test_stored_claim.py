"""PostgreSQL's stored claim (once.ledger.pg_claim.stored_claim): a connection's later claims
call a PL/pgSQL function made from the claim statement's own text. The same script of claims
is played through the statement and through the function, on real servers (the embedded one,
the machine's, PgBouncer in transaction mode): every answer and every row must be the same.
Then what falls back to the statement: a function dropped under a live connection, a role
that may not create it.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledger_sql import query
from once.ledger import LedgerError, open_ledger
from once.ledger.pg_claim import stored_claim
from once.ledger.postgres import PostgresLedger
from once.ledger.records import SCHEMA_VERSION, Claim, Job
from once.ledger.url import parse_url


def _ledger(url: str, stored_from: int) -> PostgresLedger:
    ledger = open_ledger(parse_url(url))
    assert isinstance(ledger, PostgresLedger)
    ledger.STORED_FROM = stored_from
    return ledger


def _stored_functions(url: str) -> int:
    """How many stored claims the URL's schema holds."""
    return int(query(url, "SELECT count(*) FROM pg_proc WHERE proname = %s "
                          "AND pronamespace = current_schema()::regnamespace",
                     (stored_claim().name,))[0][0])


def _answer(claim: Claim) -> tuple[Any, ...]:
    """A claim's answer, but for what differs between two claimers (its id, the clock)."""
    age = claim.heartbeat_age
    return (claim.won, claim.attempt, claim.fence, claim.status, claim.owner,
            None if age is None else age > 3000, claim.state, claim.state_version,
            claim.stale_after, claim.capped, claim.interrupted)


def _script(ledger: PostgresLedger, url: str, prefix: str) -> list[Any]:
    """Every kind of answer a claim gives, in one job's life: won, held by a live owner, done,
    a rerun, a failed row retried, a stale row taken over, capped, settled, a newer schema."""
    day = Job(f"{prefix}-day", "every", "day", "UTC", stale_after=60)
    capped = Job(f"{prefix}-capped", "every", "day", "UTC", max_attempts=1, stale_after=60)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    said: list[Any] = []

    def claim(job: Job, key: str, **options: Any) -> Claim:
        answer = ledger.claim(job, key, start, start + timedelta(days=1), "me", **options)
        said.append((job.name.removeprefix(prefix), key, _answer(answer)))
        return answer

    def age(job: Job, key: str) -> None:  # an owner that died an hour ago
        query(url, "UPDATE once_runs SET heartbeat_at = heartbeat_at - interval '1 hour' "
                   "WHERE job = %s AND period = %s", (job.name, key))

    first = claim(day, "p1")
    claim(day, "p1")  # held by a live owner
    assert ledger.finish(day.name, "p1", first, "done", 0, "done")
    claim(day, "p1")  # done
    again = claim(day, "p1", rerun=True, reason="again")
    assert ledger.finish(day.name, "p1", again, "failed", 1, "failed")
    claim(day, "p1")  # failed, attempts left: retried
    age(day, "p1")
    claim(day, "p1")  # stale: taken over
    for _ in range(4):  # taken over until the cap (3 x --max-attempts), then recorded failed
        claim(capped, "p2")
        age(capped, "p2")
    claim(day, "p3")
    query(url, "UPDATE once_attempts SET status = 'done', exit_code = 0, outcome = 'done', "
               "finished_at = clock_timestamp() WHERE job = %s AND period = 'p3'", (day.name,))
    age(day, "p3")
    claim(day, "p3")  # its attempt marked done before it died: settled
    query(url, "UPDATE once_meta SET value = '999' WHERE name = 'schema_version'")
    try:
        with pytest.raises(LedgerError) as refused:
            claim(day, "p4")
        said.append(str(refused.value))
    finally:
        query(url, "UPDATE once_meta SET value = %s WHERE name = 'schema_version'",
              (str(SCHEMA_VERSION),))
    said.append(query(url, "SELECT job, period, status, attempt, fence, exit_code, "
                           "interrupted FROM once_runs WHERE job LIKE %s ORDER BY 1, 2",
                      (prefix + "-%",)))
    said.append(query(url, "SELECT job, period, attempt, fence, status, outcome, reason "
                           "FROM once_attempts WHERE job LIKE %s ORDER BY 1, 2, 3",
                      (prefix + "-%",)))
    return [_without(prefix, entry) for entry in said]


def _without(prefix: str, entry: Any) -> Any:
    """The entry with the job names' prefix dropped, to compare two scripts' transcripts."""
    if isinstance(entry, str):
        return entry.replace(prefix, "")
    if isinstance(entry, (list, tuple)):
        return type(entry)(_without(prefix, item) for item in entry)
    return entry


def test_the_stored_claim_answers_as_the_statement_does(pg_url: str) -> None:
    with _ledger(pg_url, stored_from=10**9) as statement:
        said_by_statement = _script(statement, pg_url, "statement")
        assert statement._stored_claim is None  # never asked for
    assert _stored_functions(pg_url) == 0
    with _ledger(pg_url, stored_from=1) as stored:
        said_by_function = _script(stored, pg_url, "stored")
        assert stored._stored_claim is True and stored.timeline_fences
    assert _stored_functions(pg_url) == 1
    assert said_by_function == said_by_statement
    assert said_by_statement[0] == ("-day", "p1", (True, 1, 1, "running", "me", False, None,
                                                   0, None, False, 0))


def test_a_catchups_later_claims_call_it(pg_url: str) -> None:
    job = Job("catching-up", "every", "day", "UTC")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with _ledger(pg_url, stored_from=PostgresLedger.STORED_FROM) as ledger:
        for day in range(3):
            at = start + timedelta(days=day)
            claim = ledger.claim(job, f"d{day}", at, at + timedelta(days=1), "me")
            assert claim.won and claim.fence == day + 1
            assert ledger._stored_claim is (None if day == 0 else True)
    assert _stored_functions(pg_url) == 1


def test_a_dropped_function_falls_back_to_the_statement(pg_url: str) -> None:
    job = Job("dropped", "every", "day", "UTC")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with _ledger(pg_url, stored_from=1) as ledger:
        assert ledger.claim(job, "d0", start, start + timedelta(days=1), "me").won
        assert ledger._stored_claim is True
        query(pg_url, f"DROP FUNCTION {stored_claim().name}")
        claim = ledger.claim(job, "d1", start, start + timedelta(days=1), "me")
        assert claim.won and claim.fence == 2
        # The statement from now on, its fences still composed with the timeline.
        assert ledger._stored_claim is False and ledger.timeline_fences


def test_a_role_that_may_not_create_it_claims_with_the_statement(
        pg_url: str, backend: Any) -> None:
    if backend.name == "pgbouncer":
        pytest.skip("PgBouncer knows the test's own role alone")
    schema = pg_url.rpartition("search_path%3D")[2]
    role = "once_t_" + uuid.uuid4().hex[:12]
    with _ledger(pg_url, stored_from=10**9) as owner:  # the tables, made by their owner
        assert owner.claim(Job("made", "every", "day", "UTC"), "d0",
                           datetime(2026, 1, 1, tzinfo=UTC),
                           datetime(2026, 1, 2, tzinfo=UTC), "me").won
    query(pg_url, f"CREATE ROLE {role} LOGIN")
    try:
        query(pg_url, f"GRANT USAGE ON SCHEMA {schema} TO {role}; "
                      f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} "
                      f"TO {role}")
        url = re.sub(r"://[^@/]*@", f"://{role}@", pg_url, count=1)
        job = Job("limited", "every", "day", "UTC")
        start = datetime(2026, 1, 1, tzinfo=UTC)
        with _ledger(url, stored_from=1) as ledger:
            for day in range(2):
                at = start + timedelta(days=day)
                assert ledger.claim(job, f"d{day}", at, at + timedelta(days=1), "me").won
            assert ledger._stored_claim is False and ledger.timeline_fences
        assert _stored_functions(pg_url) == 0
    finally:
        query(pg_url, f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_the_ddl_once_schema_prints_makes_it(pg_url: str) -> None:
    # A DBA's way: the DDL run by hand; the catch-up's second claim finds it and calls it.
    from once.ledger.schema import ddl

    query(pg_url, ";\n".join(ddl("postgresql")))
    assert _stored_functions(pg_url) == 1
    test_a_catchups_later_claims_call_it(pg_url)
