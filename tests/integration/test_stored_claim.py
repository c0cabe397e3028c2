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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest

from ledger_sql import query
from once.ledger import LedgerError, open_ledger, parse_url
from once.ledger.pg_claim import stored_claim
from once.ledger.postgres import PostgresLedger
from once.ledger.records import SCHEMA_VERSION, Claim, Job


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


def _claims(ledger: PostgresLedger, job: Job, days: int) -> list[Claim]:
    """A claim of each of `days` days from 2026-01-01, on the ledger's one connection."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [ledger.claim(job, f"d{day}", start + timedelta(days=day),
                         start + timedelta(days=day + 1), "me") for day in range(days)]


def _schema(url: str) -> str:
    return str(query(url, "SELECT current_schema()")[0][0])


@contextmanager
def _role(pg_url: str, grants: str) -> Iterator[str]:
    """A role of the test's own (a login, no superuser) with the grants ({role}, {schema})."""
    role = "once_t_" + uuid.uuid4().hex[:12]
    query(pg_url, f"CREATE ROLE {role} LOGIN")
    try:
        query(pg_url, grants.format(role=role, schema=_schema(pg_url)))
        yield role
    finally:
        query(pg_url, f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_a_catchups_later_claims_call_it(pg_url: str) -> None:
    with _ledger(pg_url, stored_from=PostgresLedger.STORED_FROM) as ledger:
        for day, claim in enumerate(_claims(ledger, Job("catching-up", "every", "day", "UTC"),
                                            3)):
            assert claim.won and claim.fence == day + 1
        assert ledger._stored_claim is True
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


def _tables(url: str) -> None:
    with _ledger(url, stored_from=10**9) as owner:  # made by the URL's role, the owner
        assert _claims(owner, Job("made", "every", "day", "UTC"), 1)[0].won


def test_a_role_that_may_not_create_it_claims_with_the_statement(
        pg_url: str, backend: Any) -> None:
    if backend.name == "pgbouncer":
        pytest.skip("PgBouncer knows the test's own role alone")
    _tables(pg_url)
    with _role(pg_url, "GRANT USAGE ON SCHEMA {schema} TO {role}; GRANT SELECT, INSERT, "
                       "UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}") as role:
        url = re.sub(r"://[^@/]*@", f"://{role}@", pg_url, count=1)
        with _ledger(url, stored_from=1) as ledger:
            assert all(claim.won for claim in _claims(ledger, Job("limited", "every", "day",
                                                                   "UTC"), 2))
            assert ledger._stored_claim is False and ledger.timeline_fences
        assert _stored_functions(pg_url) == 0


def _impostor(where: str) -> str:
    """A function of the stored claim's name and arguments, at `where` (a schema), that says
    every claim won with fence 1 and leaves a mark in that schema's table `called`."""
    claim = stored_claim()
    return (f"CREATE TABLE {where}.called (n int); "
            f"CREATE FUNCTION {where}.{claim.name}{claim.signature} RETURNS TABLE "
            f"(a text, b integer, c bigint, d text, e text, f float8, g text, h bigint, "
            f"i float8, j integer) LANGUAGE plpgsql AS $$ BEGIN INSERT INTO {where}.called "
            f"VALUES (1); RETURN QUERY SELECT 'won'::text, 1, 1::bigint, 'running'::text, "
            f"'x'::text, 0.0::float8, NULL::text, 0::bigint, NULL::float8, 0; END $$")


@pytest.mark.parametrize("impostor", ["another body", "another owner", "another schema"])
def test_a_function_not_ours_is_never_called(pg_url: str, backend: Any, impostor: str) -> None:
    # Whoever may create a function in the tables' schema, or in one on the search_path, must
    # not get once to run their code, nor to take its answer for the claim's.
    if backend.name == "pgbouncer" and impostor != "another body":
        pytest.skip("PgBouncer knows the test's own role alone, and passes no search_path")
    _tables(pg_url)
    schema, url = _schema(pg_url), pg_url
    if impostor == "another body":  # made by the tables' own owner, as it happens
        query(url, _impostor(schema))
    elif impostor == "another owner":  # our function to the letter, made by another role
        with _role(url, "GRANT CREATE, USAGE ON SCHEMA {schema} TO {role}") as role:
            query(url, f"SET ROLE {role}; {stored_claim().create(schema)}; RESET ROLE")
            assert _claims_by_statement(url, "owned")
        return
    else:  # in a schema the search_path names after the tables'
        elsewhere = f"{schema}_elsewhere"
        query(url, f"CREATE SCHEMA {elsewhere}; {_impostor(elsewhere)}")
        url = url.replace(f"search_path%3D{schema}", "search_path%3D"
                          + quote(f"{schema},{elsewhere}"))
        try:
            with _ledger(url, stored_from=1) as ledger:
                claims = _claims(ledger, Job("elsewhere", "every", "day", "UTC"), 3)
                assert ledger._stored_claim is True  # its own, made in the tables' schema
            assert [c.fence for c in claims] == [1, 2, 3]
            assert query(url, f"SELECT count(*) FROM {elsewhere}.called") == [(0,)]
            assert _stored_functions(pg_url) == 1
        finally:
            query(url, f"DROP SCHEMA {elsewhere} CASCADE")
        return
    assert _claims_by_statement(url, "bodied")
    assert query(url, f"SELECT count(*) FROM {schema}.called") == [(0,)]


def _claims_by_statement(url: str, name: str) -> bool:
    """Whether a ledger asked to call the stored claim at once sent the statement instead,
    and its claims were answered as the statement answers them."""
    with _ledger(url, stored_from=1) as ledger:
        claims = _claims(ledger, Job(name, "every", "day", "UTC"), 3)
        return (ledger._stored_claim is False and ledger.timeline_fences
                and [(c.won, c.fence) for c in claims] == [(True, 1), (True, 2), (True, 3)])


def test_the_ddl_once_schema_prints_makes_it(pg_url: str) -> None:
    # A DBA's way: the DDL run by hand (twice, as a deploy may); a catch-up's second claim
    # finds it and calls it.
    from once.ledger.dialects import named
    from once.ledger.schema import ddl

    query(pg_url, ";\n".join(ddl(named("postgresql"))))
    query(pg_url, ";\n".join(ddl(named("postgresql"))))
    assert _stored_functions(pg_url) == 1
    test_a_catchups_later_claims_call_it(pg_url)


def test_the_lease_counts_from_the_claim_not_from_making_the_function(pg_url: str) -> None:
    # Making it may wait (a lock, up to a second): the claim's lease must not pay for that.
    from once.deadlines import lease_now

    made_at: list[float] = []
    with _ledger(pg_url, stored_from=2) as ledger:
        make = ledger.make_stored_claim

        def making() -> bool:
            found = make()
            made_at.append(lease_now())
            return found

        ledger.make_stored_claim = making  # type: ignore[method-assign]
        _claims(ledger, Job("leased", "every", "day", "UTC"), 2)
        assert made_at and ledger.claim_sent >= made_at[0]
