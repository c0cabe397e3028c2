"""PostgreSQL's claim: one statement of CTEs, one round trip (docs/concepts/ledger.md), for
once.ledger.postgres, and the same kept in the server as a function for a catch-up's claims.
No driver, no import but once.ledger.base's schema gate.
"""

from __future__ import annotations

import re
from functools import cache
from typing import NamedTuple

from once.ledger.records import schema_gate

_GATE = schema_gate("integer")
_STALE = "r.heartbeat_at < clock_timestamp() - make_interval(secs => r.stale_after)"

# Fences across a failover (docs/how-to/high-availability.md): at least (timeline - 1) << 32, the
# timeline (pg_walfile_name's first 8 hex digits, any role may read it) read in the claim's
# own statement: a promotion's fences outgrow every earlier one; clamped to a bigint.
TIMELINE_FLOOR = ("((LEAST(('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
                  "::bit(32)::bigint, 2147483648) - 1) << 32)")

# One statement, one round trip: the schema gate and the clocks, the job's fence, the run
# row inserted or taken over, the attempt logged; when nothing was won, the row as it
# stands. ON CONFLICT sees the row's newest version; the holder is read FOR SHARE after the
# job row's lock (READ COMMITTED follows it to its latest commit). finish_in's marker
# (MARK) is read locked: a stale row whose attempt marked it done is recorded done
# (settled), else taken over and its attempt marked taken-over (superseded); a rerun
# takes it over either way. A takeover's times are read after that wait. A stale row
# that has had all its attempts (records.attempt_cap) is recorded failed (capped).
_CTES = f"""
    WITH clock AS (
        SELECT %(max_skew)s = 0
               OR abs(extract(epoch FROM clock_timestamp() - %(host_now)s)) <= %(max_skew)s
               AS ok,
               {_GATE} AS ours,
               (SELECT value FROM once_meta WHERE name = 'schema_version') AS version,
               {TIMELINE_FLOOR} AS fence_floor
    ), job AS (
        INSERT INTO once_jobs AS j (job, fence, fire_count, kind, schedule, tz, lag,
                                    max_attempts, stale_after, shards, no_overlap,
                                    first_period_start, created_at, last_fired_at)
        SELECT %(job)s, GREATEST(1, clock.fence_floor), 1, %(kind)s, %(schedule)s, %(tz)s,
               %(lag)s, %(max_attempts)s, %(stale_after)s, %(shards)s, %(no_overlap)s,
               %(period_start)s, clock_timestamp(), clock_timestamp()
        FROM clock WHERE clock.ok AND clock.ours
        ON CONFLICT (job) DO UPDATE SET
            fence = GREATEST(j.fence + 1, excluded.fence), fire_count = j.fire_count + 1,
            kind = excluded.kind,
            schedule = excluded.schedule, tz = excluded.tz, lag = excluded.lag,
            max_attempts = excluded.max_attempts, stale_after = excluded.stale_after,
            shards = excluded.shards, no_overlap = excluded.no_overlap,
            first_period_start = least(j.first_period_start, excluded.first_period_start),
            last_fired_at = excluded.last_fired_at
        RETURNING fence, state, state_version
    ), won AS (
        INSERT INTO once_runs AS r (job, period, status, attempt, fence, owner, period_start,
                                    period_end, started_at, heartbeat_at, stale_after,
                                    claim_id)
        SELECT %(job)s, %(period)s, 'running', 1, job.fence, %(owner)s, %(period_start)s,
               %(period_end)s, clock_timestamp(), clock_timestamp(), %(stale_after)s,
               %(claim_id)s
        FROM job
        ON CONFLICT (job, period) DO UPDATE SET
            status = 'running', attempt = r.attempt + 1, fence = excluded.fence,
            owner = excluded.owner, started_at = clock_timestamp(),
            heartbeat_at = clock_timestamp(), finished_at = NULL, exit_code = NULL,
            stale_after = excluded.stale_after, claim_id = excluded.claim_id
        WHERE (((r.status = 'failed' AND r.attempt - r.interrupted < %(max_attempts)s)
                OR (r.status = 'running' AND {_STALE}
                    AND ((SELECT a.status FROM once_attempts a WHERE a.job = r.job
                          AND a.period = r.period AND a.attempt = r.attempt FOR UPDATE)
                         IS DISTINCT FROM 'done' OR %(rerun)s)))
               AND (r.attempt < %(attempt_cap)s OR %(rerun)s))
           OR (%(rerun)s AND r.status IN ('done', 'failed'))
        RETURNING r.attempt, r.fence, r.started_at
    ), logged AS (
        INSERT INTO once_attempts (job, period, attempt, fence, owner, status, started_at,
                                   reason, command_hash, output, claim_id)
        SELECT %(job)s, %(period)s, attempt, fence, %(owner)s, 'running', started_at,
               %(reason)s, %(command_hash)s, NULL, %(claim_id)s
        FROM won
    ), superseded AS (
        UPDATE once_attempts a SET outcome = 'taken-over'
        FROM won
        WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = won.attempt - 1
          AND a.status = 'running' AND a.outcome IS NULL
    ), settled AS (
        UPDATE once_runs r SET status = 'done', (exit_code, finished_at) = (
                   SELECT a.exit_code, a.finished_at FROM once_attempts a
                   WHERE a.job = r.job AND a.period = r.period AND a.attempt = r.attempt
                   FOR UPDATE)
        FROM job
        WHERE r.job = %(job)s AND r.period = %(period)s AND r.status = 'running'
          AND {_STALE} AND NOT EXISTS (SELECT FROM won)
          AND (SELECT a.status FROM once_attempts a WHERE a.job = r.job
               AND a.period = r.period AND a.attempt = r.attempt FOR UPDATE) = 'done'
        RETURNING r.attempt, r.fence, r.owner, r.stale_after, r.interrupted,
                  extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS age
    ), capped AS (
        UPDATE once_runs r SET status = 'failed', finished_at = clock_timestamp()
        FROM job
        WHERE r.job = %(job)s AND r.period = %(period)s AND NOT %(rerun)s
          AND r.status = 'running' AND r.attempt >= %(attempt_cap)s AND {_STALE}
          AND NOT EXISTS (SELECT FROM won) AND NOT EXISTS (SELECT FROM settled)
        RETURNING r.attempt, r.fence, r.owner, r.stale_after, r.interrupted,
                  extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS age
    ), capped_attempt AS (
        UPDATE once_attempts a SET outcome = 'taken-over'
        FROM capped
        WHERE a.job = %(job)s AND a.period = %(period)s AND a.attempt = capped.attempt
          AND a.status = 'running' AND a.outcome IS NULL
    ), holder AS (
        SELECT r.attempt, r.fence, r.status, r.owner,
               extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS age,
               r.stale_after, r.interrupted
        FROM once_runs r, job
        WHERE r.job = %(job)s AND r.period = %(period)s AND NOT EXISTS (SELECT FROM won)
          AND NOT EXISTS (SELECT FROM settled) AND NOT EXISTS (SELECT FROM capped)
        FOR SHARE OF r
    )"""
_ANSWER = """
    SELECT 'won', attempt, won.fence, 'running', %(owner)s, 0.0::float8, job.state,
           job.state_version, NULL::float8, 0
    FROM won, job
    UNION ALL
    SELECT 'lost', attempt, fence, 'done', owner, age, NULL, 0, stale_after, interrupted
    FROM settled
    UNION ALL
    SELECT 'lost', attempt, fence, status, owner, age, NULL, 0, stale_after, interrupted
    FROM holder
    UNION ALL
    SELECT 'capped', attempt, fence, 'failed', owner, age, NULL, 0, stale_after, interrupted
    FROM capped
    UNION ALL
    SELECT 'skew', 0, 0, '', '', extract(epoch FROM clock_timestamp() - %(host_now)s)::float8,
           NULL, 0, NULL, 0
    FROM clock WHERE NOT clock.ok AND clock.ours
    UNION ALL
    SELECT 'newer', 0, 0, version, '', 0.0::float8, NULL, 0, NULL, 0
    FROM clock WHERE NOT clock.ours"""
CLAIM = _CTES + _ANSWER

# The same claim for a server that speaks PostgreSQL but cannot read its timeline (Aurora,
# CockroachDB, a role refused the functions): fences as on timeline 1 (_claim).
CLAIM_PLAIN = CLAIM.replace(TIMELINE_FLOOR, "0::bigint")


# The claim kept in the server as a PL/pgSQL function (docs/reference/tables.md), whose plans
# the server keeps for its session: the statement above is parsed and planned anew each time
# (about 1 ms: prepared statements are off for PgBouncer), the function's call is not. Its
# first call in a session costs more than the statement, so a connection's first claim is
# the statement and its later ones (a catch-up's) the call (once.ledger.postgres). Made from
# CLAIM's own text, named by a hash of it: each release of once calls its own. Whole numbers
# are bigint, as psycopg sends them to the statement: a value a column cannot hold fails
# where the statement's fails.
_ARGS = {"max_skew": "float8", "host_now": "timestamptz", "job": "text", "kind": "text",
         "schedule": "text", "tz": "text", "lag": "bigint", "max_attempts": "bigint",
         "stale_after": "float8", "shards": "bigint", "no_overlap": "bigint",
         "period_start": "timestamptz", "period": "text", "owner": "text",
         "period_end": "timestamptz", "claim_id": "text", "rerun": "boolean",
         "attempt_cap": "bigint", "reason": "text", "command_hash": "text"}
# The answer's columns and types (RETURN QUERY takes no other).
_COLUMNS = (("what", "text"), ("attempt", "integer"), ("fence", "bigint"), ("status", "text"),
            ("owner", "text"), ("age", "float8"), ("state", "text"), ("version", "bigint"),
            ("stale_after", "float8"), ("interrupted", "integer"))

# Where the tables are (once_runs as the search_path finds it, as the statement would), and
# whether this role may create there; whether a function of the stored claim's name and
# arguments there is ours to call: its body to the letter, PL/pgSQL, no SECURITY DEFINER, no
# SET of its own (a search_path), owned by this role or the tables' owner (who could put a
# trigger on them anyway), callable; NULL when there is none. A function anyone else made,
# or changed, is never called.
FIND_STORED_CLAIM = """
    SELECT n.nspname, has_schema_privilege(n.oid, 'CREATE'),
           (SELECT p.prosrc = %(source)s AND NOT p.prosecdef AND p.proconfig IS NULL
                   AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
                   AND p.proowner IN (c.relowner,
                                      (SELECT oid FROM pg_roles WHERE rolname = current_user))
                   AND has_function_privilege(p.oid, 'EXECUTE')
            FROM pg_proc p
            WHERE p.oid = to_regprocedure(quote_ident(n.nspname) || '.' || %(procedure)s))
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass('once_runs')"""


class StoredClaim(NamedTuple):
    name: str
    signature: str  # its arguments' types
    source: str  # its body, as pg_proc.prosrc holds it

    def create(self, schema: str | None = None) -> str:
        """Its DDL, in the schema (quoted here), or unqualified (`once schema --sql`). Its
        columns are named o_*: an output parameter named like a column would shadow it."""
        where = f"{_identifier(schema)}." if schema is not None else ""
        return (f"CREATE OR REPLACE FUNCTION {where}{self.name}{self.signature}\n"
                f"RETURNS TABLE ({', '.join(f'o_{n} {t}' for n, t in _COLUMNS)})\n"
                f"LANGUAGE plpgsql AS $claim${self.source}$claim$")

    def call(self, schema: str) -> str:
        """The claim as its call in the schema: CLAIM's parameters in, CLAIM's answer out."""
        args = ", ".join(f"%({n})s::{t}" for n, t in _ARGS.items())
        # %% : psycopg reads the text for placeholders, a schema's name included
        return f"SELECT * FROM {_identifier(schema).replace('%', '%%')}.{self.name}({args})"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@cache
def stored_claim() -> StoredClaim:
    """Built when a connection's second claim asks for it: a single fire never does."""
    import hashlib  # 3 ms to import: not on a single fire's path

    def positional(sql: str) -> str:  # %(name)s as the function's $n
        return re.sub(r"%\((\w+)\)s", lambda m: f"${list(_ARGS).index(m[1]) + 1}", sql)

    body = (positional(_CTES) + f", answer({', '.join(n for n, _ in _COLUMNS)}) AS ("
            + positional(_ANSWER) + ")\n    SELECT "
            + ", ".join(f"{n}::{t}" for n, t in _COLUMNS) + " FROM answer")
    source = f"\nBEGIN\n    RETURN QUERY {body};\nEND\n"
    signature = f"({', '.join(_ARGS.values())})"
    name = "once_claim_" + hashlib.sha256((signature + source).encode()).hexdigest()[:12]
    return StoredClaim(name, signature, source)
