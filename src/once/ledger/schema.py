"""The ledger's tables, in SQLAlchemy Core, and the DDL that creates or upgrades them.

`once_runs` is public (README "The ledger"): one row per (job, period), the attempt that owns it.
`once_attempts` keeps every attempt, `once_jobs` the fence counter and the schedule each job
last ran with (so reports know which periods were expected), `once_meta` the schema version.

Creation is safe under concurrent first use: it runs under a lock that only one process holds
at a time (PostgreSQL advisory lock, MySQL GET_LOCK, SQLite's write lock), and it only creates
what is missing.

Imports SQLAlchemy (and through it the URL's driver) and once.ledger's url and records: never
on the hot path. once.ledger.base imports it only when a statement finds a table or column
missing; the reports, once serve and `once schema` import it for the tables.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable

from once.ledger import LedgerError, Target, create_private, describe
from once.ledger.records import SCHEMA_VERSION as SCHEMA_VERSION  # its home, re-exported

# Times are UTC instants: timestamptz on PostgreSQL, DATETIME(6) (UTC by convention, written
# with UTC_TIMESTAMP(6)) on MySQL/MariaDB, ISO text on SQLite (`0001-01-01 00:00:00.000000`).
# SQLite rows are read by a pattern that also takes the unpadded year earlier versions wrote
# for years before 1000 (`1-01-01 ...`; `once schema` pads them): every report reads any row.
SQLITE_TIME = re.compile(r"(\d+)-(\d+)-(\d+)(?:[ T](\d+):(\d+)(?::(\d+)(?:\.(\d{6}))?)?)?")
UtcTime = (DateTime(timezone=True)
           .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
           .with_variant(sqlite.DATETIME(regexp=SQLITE_TIME), "sqlite"))  # type: ignore[no-untyped-call]
# Keys compare byte for byte everywhere: binary collation on MySQL/MariaDB.
Key = String(255).with_variant(
    mysql.VARCHAR(255, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
)

# Text beyond MySQL's TEXT (64 KiB): MEDIUMTEXT holds 16 MiB.
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")

metadata = MetaData()
_INNODB: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}


def _instants(*names: str) -> list[Column[Any]]:
    """Required UTC-instant columns, in the order named."""
    return [Column(name, UtcTime, nullable=False) for name in names]


runs = Table(
    "once_runs", metadata,
    Column("job", Key, primary_key=True),
    Column("period", Key, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("owner", String(255), nullable=False),
    *_instants("period_start", "period_end", "started_at", "heartbeat_at"),
    Column("finished_at", UtcTime, nullable=True),
    Column("exit_code", Integer, nullable=True),
    # The owner's promise: how long (seconds) the attempt that holds the row may go without a
    # heartbeat before it counts as dead. Written by the claim that won the row; every takeover
    # and every report judges the row by it, never by the caller's own --stale-after. Rows of
    # an older ledger get the default --stale-after.
    Column("stale_after", Float, nullable=False, server_default="300"),
    # Reports count each job's done rows in its due range, and find its latest done period,
    # from this index alone (once status / once check over 1M rows).
    Index("once_runs_job_status_start", "job", "status", "period_start"),
    **_INNODB,
)
# PostgreSQL only: the same count from an index of the done rows alone (partial), a third
# narrower and with one key less to compare per row, which its planner prefers: `once check`
# counts a million of them. SQLite's planner keeps to the index above; MySQL has no partial
# indexes. Optional for every read: `once schema` adds it to a ledger made before it.
Index("once_runs_done_start", runs.c.job, runs.c.period_start,
      postgresql_where=runs.c.status == "done").ddl_if(dialect="postgresql")
# The same rule for ddl()'s own CREATE INDEX statements (ddl_if is create_all's).
_ONLY_ON = {"once_runs_done_start": "postgresql"}

attempts = Table(
    "once_attempts", metadata,
    Column("job", Key, primary_key=True),
    Column("period", Key, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("fence", BigInteger, nullable=False),
    Column("owner", String(255), nullable=False),
    Column("status", String(16), nullable=False),
    Column("started_at", UtcTime, nullable=False),
    Column("finished_at", UtcTime, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("outcome", String(16), nullable=True),
    Column("reason", Text, nullable=True),
    Column("command_hash", String(64), nullable=True),
    # The last --output-tail bytes of the attempt's stdout and stderr (UTF-8, replacement
    # characters for what is not), written with its finish; NULL when not captured. Up to
    # 1 MiB of bytes, up to three times that in UTF-8: MEDIUMTEXT on MySQL.
    Column("output", LongText, nullable=True),
    Index("once_attempts_job_started", "job", "started_at"),
    **_INNODB,
)

jobs = Table(
    "once_jobs", metadata,
    Column("job", Key, primary_key=True),
    Column("fence", BigInteger, nullable=False),
    Column("fires", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("schedule", String(255), nullable=False),
    Column("tz", String(64), nullable=False),
    Column("lag", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("stale_after", Float, nullable=False),
    *_instants("first_period_start", "created_at", "last_fire_at"),
    Column("shards", Integer, nullable=False, server_default="1"),
    # The watermark of `--state`: advanced only with a done, fenced finish (compare-and-set
    # on state_version), at most 64 KiB of UTF-8 (MEDIUMTEXT: MySQL's TEXT stops short of it).
    Column("state", LongText, nullable=True),
    Column("state_version", BigInteger, nullable=False, server_default="0"),
    **_INNODB,
)

meta = Table(
    "once_meta", metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
    **_INNODB,
)

DIALECTS: dict[str, Dialect] = {
    "sqlite": sqlite.dialect(),
    "postgresql": postgresql.dialect(),  # type: ignore[no-untyped-call]
    "mysql": mysql.dialect(),
}


def ddl(dialect: str) -> Iterator[str]:
    """The CREATE statements for a dialect, without touching any database."""
    target = DIALECTS[dialect]
    for table in metadata.sorted_tables:
        yield str(CreateTable(table, if_not_exists=True).compile(dialect=target)).strip()
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if _ONLY_ON.get(str(index.name), dialect) == dialect:
                yield str(CreateIndex(index, if_not_exists=True).compile(dialect=target)).strip()


# SQLAlchemy logs what fails while it gives a connection back (the rollback of one the server
# killed): with no handler of ours, Python's last resort printed that traceback on once's
# stderr. The errors that matter reach once as exceptions; these go nowhere. Set on import:
# every module that builds an engine (reports, once serve) imports this one.
logging.getLogger("sqlalchemy").addHandler(logging.NullHandler())


def engine(target: Target) -> Engine:
    """A SQLAlchemy engine on the ledger (NullPool: a CLI opens one connection and leaves)."""
    eng = create_engine(target.sqlalchemy_url, poolclass=NullPool, **engine_args(target))
    if target.dialect == "sqlite":
        # pysqlite would not open a transaction before DDL; take SQLite's write lock up front
        # so that concurrent first uses queue instead of racing.
        @event.listens_for(eng, "connect")
        def _no_implicit_transactions(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None

        @event.listens_for(eng, "begin")
        def _begin_immediate(conn):  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return eng


def engine_args(target: Target) -> dict[str, object]:
    if target.dialect == "sqlite":
        return {"connect_args": {"timeout": 30}}
    if target.dialect == "postgresql":
        args = {k: v for k, v in target.connect_args.items() if k != "conninfo"}
        return {"connect_args": {"prepare_threshold": None, "connect_timeout": 10, **args}}
    args = {k: v for k, v in target.connect_args.items() if k == "password"}
    return {"connect_args": {"connect_timeout": 10, "charset": "utf8mb4", **args}}


def ensure(target: Target) -> None:
    """Create or upgrade the ledger's tables; safe when many processes do it at once."""
    try:
        _prepare_sqlite_file(target)
        eng = engine(target)
        try:
            with eng.connect() as conn:
                _create_locked(conn, target)
        finally:
            eng.dispose()
    except LedgerError:
        raise
    except Exception as exc:
        raise LedgerError(
            f"cannot create the ledger's tables in {target.redacted}: {describe(exc)}"
        ) from exc


def _create_locked(conn: Connection, target: Target) -> None:
    """Create and upgrade under a lock that is released only after the commit.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: the write lock of BEGIN IMMEDIATE.
    MySQL: GET_LOCK, a session lock, taken before the transaction and released after it,
    so that the next process's snapshot sees what this one committed.
    """
    if target.dialect == "mysql":
        got = conn.execute(text("SELECT GET_LOCK('once_schema', 60)")).scalar()
        conn.commit()
        if got != 1:
            raise LedgerError(f"timed out waiting for the schema lock in {target.redacted}")
    try:
        with conn.begin():
            if target.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(7310504102)"))
            metadata.create_all(conn, checkfirst=True)
            _upgrade(conn)
    finally:
        if target.dialect == "mysql":
            conn.execute(text("SELECT RELEASE_LOCK('once_schema')"))
            conn.commit()


def _upgrade(conn: Connection) -> None:
    """Bring an older schema up to SCHEMA_VERSION, one numbered step at a time."""
    stored = conn.execute(select(meta.c.value).where(meta.c.name == "schema_version")).scalar()
    if stored is None:
        conn.execute(meta.insert().values(name="schema_version", value=str(SCHEMA_VERSION)))
        return
    version = int(stored)
    if version > SCHEMA_VERSION:
        raise LedgerError(
            f"the ledger's schema is version {version}, newer than this once knows "
            f"({SCHEMA_VERSION}): upgrade once"
        )
    _add_missing(conn)
    if conn.dialect.name == "sqlite":
        _pad_sqlite_years(conn)
    # Changes that adding columns and indexes cannot express go here, numbered:
    # `if version < 3: conn.execute(...)`.
    if version < SCHEMA_VERSION:
        conn.execute(
            meta.update().where(meta.c.name == "schema_version").values(value=str(SCHEMA_VERSION))
        )


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


def _prepare_sqlite_file(target: Target) -> None:
    """WAL for concurrent readers; a warning when the file sits on a network filesystem."""
    if target.dialect != "sqlite" or target.path == ":memory:":
        return
    import sqlite3
    import sys

    create_private(target)  # the default ledger: the user's alone
    directory = os.path.dirname(os.path.abspath(target.path))
    os.makedirs(directory, exist_ok=True)
    fstype = filesystem_type(directory)
    if fstype in NETWORK_FILESYSTEMS:
        print(
            f"once: warning: the SQLite ledger {target.path} is on a network filesystem "
            f"({fstype}); its locks are unreliable there: use PostgreSQL or MySQL for a fleet",
            file=sys.stderr,
        )
    conn = sqlite3.connect(target.path, timeout=30)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()


NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "afs",
                       "ceph", "glusterfs", "fuse.glusterfs", "lustre"}


def filesystem_type(path: str) -> str:
    """The type of the filesystem that holds path, from /proc/self/mountinfo ('' if unknown)."""
    best, fstype = "", ""
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split()
                mount_point = fields[4]
                kind = fields[fields.index("-") + 1]
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, fstype = mount_point, kind
    except (OSError, ValueError, IndexError):
        return ""
    return fstype
