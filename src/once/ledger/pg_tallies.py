"""PostgreSQL's tallies: each job's done rows and attempts counted as they change, so that a
scrape (`once metrics`, `/metrics`, `once status`) reads a few rows a job where it counted a
million index entries (docs/reference/tables.md, "The tallies").

once_tallies holds signed deltas, (job, done_runs, attempts), inserted by triggers on
once_runs and once_attempts in the writer's own transaction: a snapshot sees them and the rows
they count together, and a writer never waits on another's (inserts into a table with no
unique key). A job's tally is the sum of its rows. One insert in eight folds the job's rows
into one, taking only rows no one else holds (SKIP LOCKED): never a wait, never a deadlock,
and rows in flight are left to the next fold. The triggers fire for every writer, an older
`once` and a DBA's statement included, so the sums stay exact through a rolling upgrade.

The tables' DDL is made once, with the counts of the rows already there, under a lock that
holds writers back for that count (make); the reads use the tallies only while every trigger
is there, enabled and ours (usable), and count the rows otherwise.
No driver, no SQLAlchemy: statements and the checks of what the catalog says.
"""

from __future__ import annotations

from collections.abc import Iterable

TABLE = "once_tallies"

# Every statement names the tallies by the schema of the table the trigger is on (dynamic
# SQL, about 10 us a call): a writer whose search_path does not hold it (a DBA's session) or a
# schema renamed still counts there. Tallies dropped: nothing is counted (the reads count the
# rows until `once schema` makes them again, from the rows), and nothing fails.
_WHERE = """
    tallies text := format('%I.once_tallies', TG_TABLE_SCHEMA);"""
_MISSING = """
    IF to_regclass(tallies) IS NULL THEN
        RETURN NULL;
    END IF;"""
_ADD = "EXECUTE format('INSERT INTO %s VALUES ($1, {done}, {attempts})', tallies) USING {job};"
# One insert in eight folds the job's rows.
_FOLD_NOW = """
    IF random() < 0.125 THEN
        EXECUTE format('SELECT %I.once_tally_fold($1, $2)', TG_TABLE_SCHEMA)
        USING tallies, NEW.job;
    END IF;
    RETURN NULL;
END
"""
# A job's rows folded into one: those no other transaction holds, in READ COMMITTED only (a
# REPEATABLE READ writer would fail on a row another fold deleted after its snapshot).
_FOLD = """
DECLARE
    held tid[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT ARRAY(SELECT ctid FROM %s WHERE job = $1 FOR UPDATE SKIP LOCKED)',
                   tallies) INTO held USING j;
    IF cardinality(held) > 1 THEN
        EXECUTE format('WITH g AS (DELETE FROM %1$s WHERE ctid = ANY ($1) '
                       'RETURNING done_runs, attempts) '
                       'INSERT INTO %1$s SELECT $2, sum(g.done_runs), sum(g.attempts) FROM g '
                       'HAVING sum(g.done_runs) <> 0 OR sum(g.attempts) <> 0', tallies)
        USING held, j;
    END IF;
END
"""
# A once_runs row that became done or stopped being done (or moved to another job).
_RUNS = f"""
DECLARE{_WHERE}
BEGIN{_MISSING}
    IF TG_OP = 'UPDATE' AND OLD.status = 'done' THEN
        {_ADD.format(done=-1, attempts=0, job="OLD.job")}
    END IF;
    IF NEW.status = 'done' THEN
        {_ADD.format(done=1, attempts=0, job="NEW.job")}
    END IF;{_FOLD_NOW}"""
# A once_attempts row inserted (or moved to another job).
_ATTEMPTS = f"""
DECLARE{_WHERE}
BEGIN{_MISSING}
    IF TG_OP = 'UPDATE' THEN
        {_ADD.format(done=0, attempts=-1, job="OLD.job")}
    END IF;
    {_ADD.format(done=0, attempts=1, job="NEW.job")}{_FOLD_NOW}"""
# A DELETE's rows, one delta a job (a prune deletes a million in a few statements).
_RUNS_GONE = f"""
DECLARE{_WHERE}
BEGIN{_MISSING}
    EXECUTE format('INSERT INTO %s SELECT job, -count(*), 0 FROM gone '
                   'WHERE status = ''done'' GROUP BY job', tallies);
    RETURN NULL;
END
"""
_ATTEMPTS_GONE = f"""
DECLARE{_WHERE}
BEGIN{_MISSING}
    EXECUTE format('INSERT INTO %s SELECT job, 0, -count(*) FROM gone GROUP BY job', tallies);
    RETURN NULL;
END
"""
# TRUNCATE: what its table's rows added, taken back (it waited for every writer of it).
_TRUNCATED = f"""
DECLARE{_WHERE}
BEGIN{_MISSING}
    IF TG_TABLE_NAME = 'once_runs' THEN
        EXECUTE format('INSERT INTO %1$s SELECT job, -sum(done_runs), 0 FROM %1$s '
                       'GROUP BY job HAVING sum(done_runs) <> 0', tallies);
    ELSE
        EXECUTE format('INSERT INTO %1$s SELECT job, 0, -sum(attempts) FROM %1$s '
                       'GROUP BY job HAVING sum(attempts) <> 0', tallies);
    END IF;
    RETURN NULL;
END
"""
# (function, its arguments, its body).
FUNCTIONS = (("once_tally_fold", "tallies text, j text", "void", _FOLD),
             ("once_tally_runs", "", "trigger", _RUNS),
             ("once_tally_attempts", "", "trigger", _ATTEMPTS),
             ("once_tally_runs_gone", "", "trigger", _RUNS_GONE),
             ("once_tally_attempts_gone", "", "trigger", _ATTEMPTS_GONE),
             ("once_tally_truncated", "", "trigger", _TRUNCATED))
_DONE_CHANGED = ("(OLD.status = 'done') IS DISTINCT FROM (NEW.status = 'done') "
                 "OR OLD.job IS DISTINCT FROM NEW.job")
# (trigger, table, when and how, function).
TRIGGERS = (
    ("once_tally_runs_new", "once_runs",
     "AFTER INSERT ON once_runs FOR EACH ROW WHEN (NEW.status = 'done')", "once_tally_runs"),
    ("once_tally_runs_changed", "once_runs",
     f"AFTER UPDATE ON once_runs FOR EACH ROW WHEN ({_DONE_CHANGED})", "once_tally_runs"),
    ("once_tally_runs_gone", "once_runs",
     "AFTER DELETE ON once_runs REFERENCING OLD TABLE AS gone FOR EACH STATEMENT",
     "once_tally_runs_gone"),
    ("once_tally_runs_truncated", "once_runs",
     "AFTER TRUNCATE ON once_runs FOR EACH STATEMENT", "once_tally_truncated"),
    ("once_tally_attempts_new", "once_attempts",
     "AFTER INSERT ON once_attempts FOR EACH ROW", "once_tally_attempts"),
    ("once_tally_attempts_moved", "once_attempts",
     "AFTER UPDATE ON once_attempts FOR EACH ROW WHEN (OLD.job IS DISTINCT FROM NEW.job)",
     "once_tally_attempts"),
    ("once_tally_attempts_gone", "once_attempts",
     "AFTER DELETE ON once_attempts REFERENCING OLD TABLE AS gone FOR EACH STATEMENT",
     "once_tally_attempts_gone"),
    ("once_tally_attempts_truncated", "once_attempts",
     "AFTER TRUNCATE ON once_attempts FOR EACH STATEMENT", "once_tally_truncated"),
)


def ddl() -> str:
    """One statement that makes the tallies with the counts of the rows already there (a DO
    block: one transaction even in autocommit): writers held back while it counts (SHARE ROW
    EXCLUSIVE lets reads on, and no other maker in), the triggers made first (`once schema`,
    `once schema --sql`)."""
    statements = [
        "LOCK TABLE once_runs, once_attempts IN SHARE ROW EXCLUSIVE MODE",
        f"CREATE TABLE IF NOT EXISTS {TABLE} (job VARCHAR(255) NOT NULL, "
        "done_runs BIGINT NOT NULL, attempts BIGINT NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS once_tallies_job ON {TABLE} (job)"]
    statements += [f"CREATE OR REPLACE FUNCTION {name}({args}) RETURNS {returns} "
                   f"LANGUAGE plpgsql AS $once${body}$once$"
                   for name, args, returns, body in FUNCTIONS]
    for name, table, event, function in TRIGGERS:
        statements.append(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        statements.append(f"CREATE TRIGGER {name} {event} EXECUTE PROCEDURE {function}()")
    statements += [f"DELETE FROM {TABLE}",
                   f"INSERT INTO {TABLE} SELECT job, count(*), 0 FROM once_runs "
                   "WHERE status = 'done' GROUP BY job",
                   f"INSERT INTO {TABLE} SELECT job, 0, count(*) FROM once_attempts GROUP BY job"]
    body = ";\n".join(statements)
    return f"DO $tallies$ BEGIN\n{body};\nEND $tallies$"


# What the catalog says of them, in the schema where once_runs is: whether the tallies' table
# is there and can be trusted (in once_runs' schema; on a logical replica, whose apply fires
# no trigger, only if the tallies are replicated with both tables), then (trigger, its table,
# enabled, its function, that function's body) for each trigger of ours. A body that is not
# ours, a trigger disabled or missing, and the reads count the rows.
CATALOG = """
    SELECT coalesce((SELECT c.relnamespace FROM pg_class c
                     WHERE c.oid = to_regclass('once_tallies'))
                    = (SELECT c.relnamespace FROM pg_class c
                       WHERE c.oid = to_regclass('once_runs')), false),
           (SELECT count(DISTINCT s.srrelid) FROM pg_subscription_rel s
                WHERE s.srrelid IN (to_regclass('once_runs'), to_regclass('once_attempts'),
                                    to_regclass('once_tallies'))) IN (0, 3),
           t.tgname, c.relname, t.tgenabled, p.proname, p.prosrc
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid
    WHERE t.tgrelid IN (to_regclass('once_runs'), to_regclass('once_attempts'))
      AND t.tgname = ANY (%(names)s)"""
CATALOG_PARAMS = {"names": [name for name, *_ in TRIGGERS]}
_BODIES = {name: body for name, _, _, body in FUNCTIONS}
EXPECTED = {(name, table, function, _BODIES[function])
            for name, table, _, function in TRIGGERS}


def missing(rows: Iterable[tuple[object, ...]]) -> bool:
    """Whether CATALOG's rows lack a trigger of ours (or the table): then make them again
    (`once schema`). One disabled, or another release's body, is left as it is."""
    rows = list(rows)
    return (not all(row[0] for row in rows)
            or {row[2] for row in rows} != {name for name, *_ in TRIGGERS})


def usable(rows: Iterable[tuple[object, ...]]) -> bool:
    """Whether CATALOG's rows say every trigger is there, enabled and ours, and the table in
    once_runs' schema (enabled as made, 'O': where the session is an origin; 'A', always,
    would count twice what a logical replica's apply writes, tallies included)."""
    found = set()
    for here, replicated_alike, name, table, enabled, function, body in rows:
        if not (here and replicated_alike) or enabled != "O":
            return False
        found.add((name, table, function, body))
    return found == EXPECTED


# Reads of the tallies (fleet): each job's sum, for the names (an array); the done rows of a
# range as the job's tally less its done rows outside the range (two index ranges, mostly
# empty: a survey's range runs from the job's first period to its latest due one).
DONE_IN_RANGES = (
    "SELECT v.i, coalesce((SELECT sum(t.done_runs) FROM once_tallies t WHERE t.job = v.j), 0)"
    " - (SELECT count(*) FROM once_runs r WHERE r.job = v.j AND r.status = 'done' "
    "AND r.period_start < v.a)"
    " - (SELECT count(*) FROM once_runs r WHERE r.job = v.j AND r.status = 'done' "
    "AND r.period_start >= v.b) FROM v ORDER BY v.i")
ATTEMPTS = ("SELECT n, coalesce((SELECT sum(t.attempts) FROM once_tallies t WHERE t.job = n), 0)"
            " - (SELECT count(*) FROM once_attempts s WHERE s.job = n AND s.period = {state})"
            " FROM unnest(%(names)s::text[]) n")
