"""The ledger's tables, in SQLAlchemy Core: their columns, keys and indexes, as every backend
holds them (`metadata`).

`once_runs` is public (docs/concepts/ledger.md): one row per (job, period), the attempt that
owns it. `once_attempts` keeps every attempt, `once_jobs` the fence counter and the schedule
each job last ran with (so reports know which periods were expected), `once_meta` the schema
version; `once_leases`, `once_lead_terms` and `once_lead_candidates` are `once lead`'s.

Declarations alone: once.ledger.schema makes them (DDL, the creation under its lock) and
once.ledger.upgrade brings an older ledger's up to them; the reports' statements
(once.ledger.history, prune) read them. Imports SQLAlchemy: never on the hot path.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import mysql, sqlite

from once.ledger.rows import UNUSUAL_ATTEMPT

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
# Both prefixes: SQLAlchemy's mariadb dialect (a mariadb:// URL) ignores the mysql_ ones, and
# its tables took the server's default charset (latin1 on many), refusing any other text.
_INNODB: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                           "mariadb_engine": "InnoDB", "mariadb_charset": "utf8mb4"}


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
    # The identity of the attempt that holds the row (schema 5): renewals and the finish match
    # on it, so that after a failover lost rows an old owner is fenced out at its next renewal
    # instead of renewing a stranger's claim of the same attempt number. NULL: claimed before.
    Column("claim_id", String(32), nullable=True),
    # How many of the row's attempts ended interrupted (schema 5): by a SIGTERM, SIGINT or
    # SIGHUP that once received and forwarded (a drain, a deploy). The retry rule counts the
    # others against --max-attempts (attempt - interrupted), the attempt cap every attempt
    # (once.outcomes.attempts_left). 0 on rows of an older ledger.
    Column("interrupted", Integer, nullable=False, server_default="0"),
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
ONLY_ON = {"once_runs_done_start": ("postgresql",),
            "once_attempts_unusual": ("sqlite", "postgresql")}

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
    # As once_runs.claim_id, but required, with no default (schema 5): an insert that does
    # not name it is refused, and only an older once's `once state --set` makes one (its
    # claims are refused by the rename of once_jobs.fires). MySQL/MariaDB without strict mode
    # fill a missing NOT NULL VARCHAR with '', which the CHECK refuses. The attempts of an
    # older once hold BEFORE_5 (once.ledger.upgrade); `once state --set` rows an id of their
    # own. (ddl_if takes a tuple of dialects, though its annotation says one.)
    Column("claim_id", String(32), nullable=False),
    CheckConstraint("claim_id <> ''", name="once_attempts_claim_id").ddl_if(
        dialect=("mysql", "mariadb")),  # type: ignore[arg-type]
    Index("once_attempts_job_started", "job", "started_at"),
    **_INNODB,
)
# SQLite and PostgreSQL: the attempts that are not plain (UNUSUAL_ATTEMPT: failed, running,
# retried, rerun, interrupted, `once state --set`'s), a few of the millions an old ledger
# keeps, so that `once metrics` counts the plain ones in indexes and reads these alone
# (once.ledger.fleet's attempt_tallies), not every attempt's row. MySQL has no partial
# indexes. Optional for every read: `once schema` adds it to a ledger made before it.
Index("once_attempts_unusual", attempts.c.job, sqlite_where=text(UNUSUAL_ATTEMPT),
      postgresql_where=text(UNUSUAL_ATTEMPT)).ddl_if(
    dialect=("sqlite", "postgresql"))  # type: ignore[arg-type]
# once_attempts.claim_id of the attempts recorded before schema 5 (the upgrade's backfill).
BEFORE_5 = "before-5"

jobs = Table(
    "once_jobs", metadata,
    Column("job", Key, primary_key=True),
    Column("fence", BigInteger, nullable=False),
    # `fires` before schema 5: the rename is what refuses every older once's claim (see
    # once.ledger.upgrade), as each of them names the old column; `last_fired_at`
    # (`last_fire_at` before) every older `once prune`, which reads it first.
    Column("fire_count", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("schedule", String(255), nullable=False),
    Column("tz", String(64), nullable=False),
    Column("lag", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("stale_after", Float, nullable=False),
    *_instants("first_period_start", "created_at", "last_fired_at"),
    Column("shards", Integer, nullable=False, server_default="1"),
    # The latest claim's --no-overlap (1: on): the reports do not call the periods after a
    # live attempt missing while it runs, as no claim could take them meanwhile.
    Column("no_overlap", Integer, nullable=False, server_default="0"),
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

# `once lead` (once.ledger.leases): a compatible addition (docs/how-to/upgrading.md), tables
# no claim, report or prune of an older once reads or writes, made by the first `once lead`
# (or `once schema`) on a ledger of schema 5 without a change of its version.
# One row per lead name: who holds it (holder: one process's own id; owner: its name), the
# term (its fencing token), and until when, on the database's clock. A free lease has no
# holder, or an expires_at that has passed.
leases = Table(
    "once_leases", metadata,
    Column("name", Key, primary_key=True),
    Column("holder", String(64), nullable=True),
    Column("owner", String(255), nullable=True),
    Column("term", BigInteger, nullable=False),
    Column("lease_seconds", Float, nullable=False),
    Column("acquired_at", UtcTime, nullable=True),
    Column("renewed_at", UtcTime, nullable=True),
    Column("expires_at", UtcTime, nullable=False),
    **_INNODB,
)

# Every term of every lead name: who held it, from when to when, and how it ended
# (released, lost, expired; NULL while it lasts).
lead_terms = Table(
    "once_lead_terms", metadata,
    Column("name", Key, primary_key=True),
    Column("term", BigInteger, primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("lease_seconds", Float, nullable=False),
    Column("started_at", UtcTime, nullable=False),
    Column("ended_at", UtcTime, nullable=True),
    Column("ended", String(16), nullable=True),
    **_INNODB,
)

# The candidates waiting for a lead name, each seen every --lease (at least every 5 s).
lead_candidates = Table(
    "once_lead_candidates", metadata,
    Column("name", Key, primary_key=True),
    Column("holder", String(64), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("seen_at", UtcTime, nullable=False),
    **_INNODB,
)
