"""The upgrade of an older ledger to SCHEMA_VERSION, step by step (docs/how-to/upgrading.md), in
the transaction and under the lock of once.ledger.schema's creation, which calls it with the
ledger's backend (a once.ledger.dialect.Dialect: the traits that say how its DDL differs).

Imports SQLAlchemy and once.ledger.tables: never on the hot path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateColumn

from once.ledger.records import SCHEMA_VERSION, newer_schema
from once.ledger.tables import BEFORE_5, attempts, jobs, meta, metadata, runs

if TYPE_CHECKING:
    from once.ledger.dialect import Dialect


def upgrade(conn: Connection, backend: Dialect) -> None:
    """Bring an older schema up to SCHEMA_VERSION, one numbered step at a time.

    MySQL commits each DDL statement on its own: an upgrade killed half-way keeps the steps
    it made. So the new version is written first, with the one upgraded from (`upgrade_from`,
    until the last step): from the first step on, an older once's own upgrade path reads the
    newer version and refuses the ledger (it would otherwise add back the column the rename
    took, and no version could claim), and the next upgrade makes the steps left. Elsewhere the
    upgrade is one transaction, which that row enters and leaves.
    """
    stored = conn.execute(select(meta.c.value).where(meta.c.name == "schema_version")).scalar()
    if stored is None:
        conn.execute(meta.insert().values(name="schema_version", value=str(SCHEMA_VERSION)))
        # MySQL commits each CREATE on its own: a first use killed half-way left tables that
        # create_all passed over, without the indexes it had not made yet (an outside
        # attacker's finding: nothing said so, and the reports lost the indexes they read).
        _add_missing(conn)
        return
    version = int(stored)
    if version > SCHEMA_VERSION:
        raise newer_schema(version)
    begun = conn.execute(select(meta.c.value).where(meta.c.name == "upgrade_from")).scalar()
    since = version if begun is None else min(version, int(begun))
    if since < SCHEMA_VERSION:
        if begun is None:
            conn.execute(meta.insert().values(name="upgrade_from", value=str(since)))
        conn.execute(
            meta.update().where(meta.c.name == "schema_version").values(value=str(SCHEMA_VERSION))
        )
    if since < 5:
        _gate_older_claims(conn, backend)
    _require_claim_ids(conn, backend)
    _add_missing(conn)
    if backend.text_times:
        _pad_sqlite_years(conn)
    if since < 3:
        _keep_unstored_promises(conn)
    if since < SCHEMA_VERSION:
        conn.execute(meta.delete().where(meta.c.name == "upgrade_from"))


# Schema 5's renames: (old, new, the column's MySQL type for CHANGE).
_RENAMED = (("fires", "fire_count", "BIGINT NOT NULL"),
            ("last_fire_at", "last_fired_at", "DATETIME(6) NOT NULL"))


def _gate_older_claims(conn: Connection, backend: Dialect) -> None:
    """Schema 5: once_jobs.fires becomes fire_count, last_fire_at last_fired_at. Every claim
    of an older once names `fires`, every older `once prune` reads `last_fire_at` first: it
    meets a missing column, and the claim reads the version through its own upgrade path and
    refuses the newer ledger (exit 75) with nothing run; `once prune` says which column is
    missing (exit 75), with nothing deleted. Renewals and finishes name no once_jobs column
    but the watermark's, so an attempt claimed before the upgrade still ends as it would."""
    present = {column["name"] for column in inspect(conn).get_columns("once_jobs")}
    for old, new, mysql_type in _RENAMED:
        if old not in present:
            continue
        if backend.renames_by_change:  # CHANGE: MariaDB before 10.5 has no RENAME COLUMN
            conn.execute(text(f"ALTER TABLE once_jobs CHANGE {old} {new} {mysql_type}"))
        else:
            conn.execute(text(f"ALTER TABLE once_jobs RENAME COLUMN {old} TO {new}"))


def _require_claim_ids(conn: Connection, backend: Dialect) -> None:
    """Schema 5: once_attempts.claim_id NOT NULL with no default (and, on MySQL/MariaDB, not
    ''), so that an older `once state --set`, whose record of the change names no claim_id,
    is refused with nothing written (its change of the watermark is in the same transaction,
    or the same statement). The rows already there get BEFORE_5.

    Each step is made only if still needed, so that a MySQL upgrade cut short (each statement
    commits on its own) is finished by the next: the column is added with BEFORE_5 as its
    default, then (one statement) the default goes and the CHECK comes. A ledger whose column
    was made nullable (schema 5 as first written) is tightened the same way. SQLite cannot
    change a column: the table is made again."""
    column = {c["name"]: c for c in inspect(conn).get_columns("once_attempts")}.get("claim_id")
    if not backend.alters_columns:
        if column is None or column["nullable"] or column["default"] is not None:
            _remake_sqlite_attempts(conn)
        return
    mysql = backend.renames_by_change  # MySQL or MariaDB: ALTER TABLE ... CHANGE and MODIFY
    has_default = column is not None and column["default"] is not None
    if column is None:
        conn.execute(text("ALTER TABLE once_attempts ADD COLUMN claim_id VARCHAR(32) NOT NULL "
                          f"DEFAULT '{BEFORE_5}'"))
        has_default = True
    elif column["nullable"]:
        conn.execute(text(f"UPDATE once_attempts SET claim_id = '{BEFORE_5}' "
                          "WHERE claim_id IS NULL"))
        if mysql:
            conn.execute(text("ALTER TABLE once_attempts MODIFY claim_id VARCHAR(32) NOT NULL "
                              f"DEFAULT '{BEFORE_5}'"))
            has_default = True
        else:
            conn.execute(text("ALTER TABLE once_attempts ALTER COLUMN claim_id SET NOT NULL"))
    steps = ["ALTER COLUMN claim_id DROP DEFAULT"] if has_default else []
    if backend.lax_not_null and "once_attempts_claim_id" not in {
            c["name"] for c in inspect(conn).get_check_constraints("once_attempts")}:
        # An older state --set on a server without strict mode, between the steps: ''.
        conn.execute(text(f"UPDATE once_attempts SET claim_id = '{BEFORE_5}' "
                          "WHERE claim_id = ''"))
        steps.append("ADD CONSTRAINT once_attempts_claim_id CHECK (claim_id <> '')")
    if steps:
        conn.execute(text(f"ALTER TABLE once_attempts {', '.join(steps)}"))


def _remake_sqlite_attempts(conn: Connection) -> None:
    """once_attempts made again as declared (SQLite has no ALTER COLUMN), its rows copied,
    BEFORE_5 where they have no claim_id; in the upgrade's transaction."""
    present = {c["name"] for c in inspect(conn).get_columns("once_attempts")}
    for index in sorted(str(i.name) for i in attempts.indexes):  # names are the schema's
        conn.execute(text(f"DROP INDEX IF EXISTS {index}"))
    conn.execute(text("ALTER TABLE once_attempts RENAME TO once_attempts_before_5"))
    attempts.create(conn)
    kept = ", ".join(c.name for c in attempts.columns
                     if c.name in present and c.name != "claim_id")
    claim_id = (f"coalesce(claim_id, '{BEFORE_5}')" if "claim_id" in present
                else f"'{BEFORE_5}'")
    conn.execute(text(f"INSERT INTO once_attempts ({kept}, claim_id) "
                      f"SELECT {kept}, {claim_id} FROM once_attempts_before_5"))
    conn.execute(text("DROP TABLE once_attempts_before_5"))


def _keep_unstored_promises(conn: Connection) -> None:
    """Schema 3 stored each owner's --stale-after in its row; a running row of an older
    owner got the column's default (300 s), so a newer caller could take over an owner that
    promised more while it still renewed. Its job's recorded --stale-after (its latest
    claim's) is the best evidence of that promise: such rows keep the larger of the two."""
    promised = (select(jobs.c.stale_after).where(jobs.c.job == runs.c.job)
                .scalar_subquery())
    conn.execute(runs.update().where(runs.c.status == "running", promised > runs.c.stale_after)
                 .values(stale_after=promised))


# The columns that can hold a period's bounds, the only times that can be before year 1000.
_PERIOD_TIMES = (("once_runs", "period_start"), ("once_runs", "period_end"),
                 ("once_jobs", "first_period_start"))


def _pad_sqlite_years(conn: Connection) -> None:
    """Four-digit years in SQLite times that earlier versions wrote unpadded (the year 1 as
    `1-01-01 ...`): they sorted after 2026 and compared wrongly. Padded text is 26
    characters, so the WHERE clause finds only the old rows."""
    for table, column in _PERIOD_TIMES:
        conn.execute(text(
            f"UPDATE {table} SET {column} = substr('000', 1, 26 - length({column})) || {column} "
            f"WHERE length({column}) BETWEEN 23 AND 25 AND {column} GLOB '[0-9]*-[0-9][0-9]-*'"))


def _add_missing(conn: Connection) -> None:
    """Additive upgrades: columns and indexes declared here but missing in the database.

    A new NOT NULL column carries a server default, so existing rows get it too.
    """
    inspector = inspect(conn)
    for table in metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                spec = CreateColumn(column).compile(dialect=conn.dialect)
                conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {spec}"))
        for index in table.indexes:
            index.create(conn, checkfirst=True)
