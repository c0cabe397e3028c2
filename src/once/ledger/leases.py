"""`once lead`'s statements: a lease per lead name, judged by the database's clock.

A candidate reads the lease (`peek`, a plain read: a hundred candidates cost the server next
to nothing) and tries to acquire it only when it is free: one UPDATE that only one of any
number of callers can win, as it changes what it tests (no holder, or an expires_at that has
passed). The winner's term is larger than every term of that name before it: the row's term
plus one, on PostgreSQL at least the timeline's floor (once.ledger.pg_claim.TIMELINE_FLOOR),
so that a promotion that lost commits never hands out a term again. A renewal and a release
name the holder (one process's own id) and the term, and match nothing once either changed:
a renewal can never extend another's lease. docs/concepts/leases.md says the rest.

The tables (once.ledger.schema: once_leases, once_lead_terms, once_lead_candidates) are a
compatible addition: made by the first statement that misses them, as every table is.
Imports the stdlib and the ledger's own modules; not on `once run`'s path.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from once.deadlines import lease_now
from once.ledger.base import Ledger
from once.ledger.fleet import failed_read
from once.ledger.records import LedgerError, schema_gate

if TYPE_CHECKING:
    from once.ledger.dbapi import Connection, Params, Row
    from once.ledger.dialect import Dialect

class _Transactional(Protocol):
    """What each dialect's ledger has beside the shared flow: one transaction, a cursor for
    statements in the pyformat style (named style on SQLite: _sql converts)."""

    def _transaction(self) -> AbstractContextManager[Any]: ...


# A free lease's expires_at before its first holder: long past on every clock.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Per dialect: the database's clock in a statement (constant within it), that clock plus
# %(lease)s seconds, and the next term of the row being updated.
_NOW = {"postgresql": "statement_timestamp()", "mysql": "UTC_TIMESTAMP(6)",
        "sqlite": "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')"}
_UNTIL = {"postgresql": "statement_timestamp() + make_interval(secs => %(lease)s)",
          "mysql": "UTC_TIMESTAMP(6) + INTERVAL ROUND(%(lease)s * 1000000) MICROSECOND",
          "sqlite": "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %(lease)s || "
                    "' seconds') || '000')"}


# Every acquire carries the schema gate (once.ledger.records.schema_gate): a ledger a newer
# once has upgraded refuses it, as it refuses a claim.
_GATE = {dialect: schema_gate(integer) for dialect, integer in
         (("postgresql", "integer"), ("mysql", "SIGNED"), ("sqlite", "INTEGER"))}


def _next_term(dialect: str, timeline: bool) -> str:
    if dialect == "postgresql" and timeline:
        from once.ledger.pg_claim import TIMELINE_FLOOR

        return f"GREATEST(term + 1, {TIMELINE_FLOOR})"
    if dialect == "mysql":  # handed back in the OK packet (cursor.lastrowid)
        return "LAST_INSERT_ID(term + 1)"
    return "term + 1"


@dataclass(frozen=True)
class Peek:
    """A lease as a candidate sees it: free now, or free in `free_in` seconds (database
    time) unless renewed; who holds it and in which term."""

    exists: bool
    free_in: float
    owner: str | None
    term: int
    holder: str | None = None  # the holder's id (new_holder); None: nobody holds it

    @property
    def free(self) -> bool:
        return self.free_in <= 0


@dataclass(frozen=True)
class Lead:
    """A lead name as the reports show it (once_leases and its waiting candidates)."""

    name: str
    owner: str | None  # the holder's name; None: nobody holds it
    term: int
    lease_seconds: float
    acquired_at: datetime | None
    renewed_at: datetime | None
    expires_at: datetime
    now: datetime  # the database's clock when read
    candidates: int  # seen within three of their intervals

    @property
    def held(self) -> bool:
        return self.owner is not None and self.expires_at > self.now

    @property
    def leaderless_for(self) -> float:
        """Seconds since the last holder's lease ended (0 while one holds it)."""
        return 0.0 if self.held else max(0.0, (self.now - self.expires_at).total_seconds())


@dataclass(frozen=True)
class TermRow:
    """One term of a lead name (once_lead_terms)."""

    name: str
    term: int
    owner: str
    lease_seconds: float
    started_at: datetime
    ended_at: datetime | None
    ended: str | None  # released, lost, expired; None: it lasts (or ended unseen)


def new_holder() -> str:
    """A holder's id: one process's own, never another's (two processes of one pod, with one
    ONCE_OWNER, are two holders). secrets.token_hex(16), without the import of secrets (hmac,
    hashlib, random: 5-8 ms of every report that reads the lead names)."""
    return os.urandom(16).hex()


# How often a candidate says it waits (once_lead_candidates.seen_at), and how long a row
# counts: a report counts a candidate seen within three of these.
def stand_interval(lease: float) -> float:
    return max(5.0, lease)


class Leases:
    """The lease statements on one ledger connection (once.ledger.base.Ledger's)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.dialect = ledger.dialect
        self.timeline = ledger.dialect == "postgresql"  # off where the server cannot say
        self._host_lock: Any = None  # SQLite: the lead's OS lock while we take or hold it

    # SQLite: the host's clock is the ledger's, and one stepped forward (NTP, a resume) would
    # end a live leader's lease early. So, as a claim holds its period's OS lock
    # (once.ledger.sqlite._PeriodLocks), an acquire also needs the lead name's, on an open
    # file description of its own: the leader hands it to its guard (hand_over), which holds
    # it while the command runs and drops it when it dies, also while `once lead` itself is
    # stopped. No clock can make a lease look free while a leader's command may still run.

    def _take_host_lock(self, name: str) -> bool:
        if self.dialect != "sqlite":
            return True
        from once.ledger.sqlite import _PeriodLocks

        locks = _PeriodLocks(self.ledger.target.path)
        if not locks.acquire(("once lead", name)):
            locks.close()
            return False
        self._host_lock = locks
        return True

    def hand_over(self) -> None:
        """Let go of our copy of the lead's OS lock (SQLite): the guard, forked with it, holds
        it from now on (once.run.lead). A no-op elsewhere."""
        locks, self._host_lock = self._host_lock, None
        if locks is not None:
            locks.close()

    def _sql(self, text: str) -> str:
        text = text.replace("{now}", _NOW[self.dialect]).replace("{until}", _UNTIL[self.dialect])
        if self.dialect == "sqlite":
            from once.ledger.sqlite import pyformat_to_named

            return pyformat_to_named(text)
        return text

    def _upsert(self, sql: str, on_conflict: tuple[str, str]) -> str:
        """An insert with its dialect's answer to a row already there (standard, MySQL)."""
        return sql.replace("{on_conflict}", on_conflict[self.dialect == "mysql"])

    def _run(self, doing: str, work: Any) -> Any:
        """`work(execute)` in one transaction, the tables made if missing; a driver's error
        as a LedgerError saying what was being done."""
        ledger = self.ledger

        def attempt() -> Any:
            with cast("_Transactional", ledger)._transaction() as cur:
                def execute(sql: str, params: Params) -> Any:
                    cur.execute(self._sql(sql), params)
                    return cur
                return work(execute)

        return ledger._with_schema(attempt, doing)

    def _one(self, doing: str, sql: str, params: Params) -> int:
        """One statement as its own transaction (Ledger._single: a process stopped after it
        holds no lock that would keep the others waiting), the tables made if missing; the
        rows it changed."""
        ledger = cast("Any", self.ledger)
        return int(ledger._with_schema(lambda: ledger._single(self._sql(sql), params), doing))

    # -- a candidate

    PEEK = """
        SELECT holder, owner, term, expires_at, {now} FROM once_leases WHERE name = %(name)s"""

    def peek(self, name: str) -> Peek:
        """A plain read, no lock, no write: a hundred candidates' looks cost what their
        reads cost (on SQLite, a write transaction would queue them behind each other and
        the leader's renewals)."""
        rows = self.ledger._read(self.PEEK.replace("{now}", _NOW[self.dialect]),
                                 {"name": name})
        if not rows:
            return Peek(False, 0.0, None, 0)
        holder, owner, term, expires, now = rows[0]
        backend = self.ledger.backend
        left = (backend.from_db(expires) - backend.from_db(now)).total_seconds()
        return Peek(True, left if holder is not None else 0.0, owner, int(term), holder)

    # Made with no holder and long expired; the row's lock is then what acquirers race on.
    # Its term goes on from the name's history: a name retired (its row deleted) and used
    # again never hands out a term it has had.
    SEED = """INSERT INTO once_leases (name, term, lease_seconds, expires_at)
              SELECT %(new_name)s, COALESCE(MAX(term), 0), %(lease)s, %(epoch)s
              FROM once_lead_terms WHERE name = %(name)s {on_conflict}"""
    SEED_CONFLICT = ("ON CONFLICT DO NOTHING",
                     "ON DUPLICATE KEY UPDATE once_leases.name = once_leases.name")

    ACQUIRE = """
        UPDATE once_leases SET holder = %(holder)s, owner = %(owner)s, term = {term},
               lease_seconds = %(lease)s, acquired_at = {now}, renewed_at = {now},
               expires_at = {until}
        WHERE name = %(name)s AND (holder IS NULL OR expires_at <= {now}) AND {gate}"""
    CLOSE_EXPIRED = """
        UPDATE once_lead_terms SET ended = 'expired', ended_at = %(expired_at)s
        WHERE name = %(name)s AND term < %(term)s AND ended IS NULL"""
    OPEN_TERM = """
        INSERT INTO once_lead_terms (name, term, owner, lease_seconds, started_at)
        VALUES (%(name)s, %(term)s, %(owner)s, %(lease)s, {now})"""
    WITHDRAW = "DELETE FROM once_lead_candidates WHERE name = %(name)s AND holder = %(holder)s"
    PREVIOUS = "SELECT holder, expires_at FROM once_leases WHERE name = %(name)s"

    def acquire(self, name: str, holder: str, owner: str, lease: float) -> tuple[int, float] | None:
        """Take the lease if it is free: (the term won, when the statement was sent on the
        lease clock: the deadline counts from there); None when another holds it."""
        params: Params = {"name": name, "new_name": name, "holder": holder, "owner": owner,
                          "lease": float(lease), "epoch": self.ledger.backend.bind(_EPOCH)}
        if not self._take_host_lock(name):
            return None  # SQLite: a leader's command may still run

        def work(execute: Any) -> int | None:
            previous = execute(self.PREVIOUS, params).fetchone()
            if previous is None:
                execute(self._upsert(self.SEED, self.SEED_CONFLICT), params)
            term = self._acquire(execute, params)
            if term is None:  # held; or a ledger newer than this once, which refuses us
                self.ledger.refuse_newer(execute(self.ledger.STORED_VERSION, {}).fetchone())
                return None
            expired_at = previous[1] if previous is not None and previous[0] else None
            if expired_at is not None:
                execute(self.CLOSE_EXPIRED, {**params, "term": term, "expired_at": expired_at})
            execute(self.OPEN_TERM, {**params, "term": term})
            execute(self.WITHDRAW, params)
            return term

        term = None
        try:
            term = self._run_with_timeline("cannot acquire the lease in", work)
        finally:
            if term is None:
                self.hand_over()  # not won (or failed): nobody is to hold it for us
        return None if term is None else (int(term), float(params["sent"]))

    def _run_with_timeline(self, doing: str, work: Any) -> Any:
        """_run; on a PostgreSQL server that cannot read its timeline (a role refused
        pg_walfile_name, a server that is not PostgreSQL's own), again without its floor, as
        once run's claims fall back (terms then grow by one alone)."""
        if not self.timeline:
            return self._run(doing, work)
        from once.ledger.postgres import timeline_unreadable

        try:
            return self._run(doing, work)
        except LedgerError as exc:
            if not timeline_unreadable(exc.__cause__ or exc):
                raise
        self.timeline = False
        return self._run(doing, work)

    def _acquire(self, execute: Any, params: Params) -> int | None:
        """The acquire itself: its send is when the lease counts from (params["sent"]), as
        the database's expiry counts from its execution (a slow link's earlier round trips
        in the transaction cost the lease nothing)."""
        sql = self.ACQUIRE.replace("{term}", _next_term(self.dialect, self.timeline)) \
            .replace("{gate}", _GATE[self.dialect])
        params["sent"] = lease_now()
        if self.dialect == "mysql":
            cur = execute(sql, params)
            return int(cur.lastrowid) if cur.rowcount == 1 else None
        row = execute(sql + " RETURNING term", params).fetchone()
        return None if row is None else int(row[0])

    STAND = """INSERT INTO once_lead_candidates (name, holder, owner, seen_at)
               VALUES (%(name)s, %(holder)s, %(owner)s, {now}) {on_conflict}"""
    STAND_CONFLICT = ("ON CONFLICT (name, holder) DO UPDATE SET seen_at = excluded.seen_at",
                      "ON DUPLICATE KEY UPDATE seen_at = VALUES(seen_at)")

    def stand(self, name: str, holder: str, owner: str) -> None:
        """Say that this candidate waits (for the reports)."""
        params = {"name": name, "holder": holder, "owner": owner}
        self._one("cannot stand as a candidate in",
                  self._upsert(self.STAND, self.STAND_CONFLICT), params)

    def withdraw(self, name: str, holder: str) -> None:
        """This candidate waits no more."""
        params = {"name": name, "holder": holder}
        self._one("cannot withdraw the candidate from", self.WITHDRAW, params)

    # -- the holder

    # Holder and term: the lease is ours while nobody has taken it, even past its expiry on
    # the database's clock (a renewal is only sent before our own deadline, so nothing of ours
    # runs beyond it). On SQLite the host's clock stepped forward thus ends no healthy term.
    RENEW = """
        UPDATE once_leases SET renewed_at = {now}, expires_at = {until}
        WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s"""

    def renew(self, name: str, holder: str, term: int, lease: float) -> bool:
        """Extend our lease; False when it is no longer ours (taken, released, retired)."""
        params = {"name": name, "holder": holder, "term": term, "lease": float(lease)}
        return self.ledger.renewed("cannot renew the lease in", self._sql(self.RENEW), params)

    RELEASE = """
        UPDATE once_leases SET holder = NULL, owner = NULL, expires_at = {now}
        WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s"""
    END_TERM = """
        UPDATE once_lead_terms SET ended = %(how)s, ended_at = COALESCE(ended_at, {now})
        WHERE name = %(name)s AND term = %(term)s AND (ended IS NULL OR ended = 'expired')"""

    def release(self, name: str, holder: str, term: int, how: str = "released") -> bool:
        """Give the lease up (its command is dead): a candidate may take it at once. `how`
        the term ended (released, or lost: the holder stepped down). True when the lease was
        still ours."""
        params = {"name": name, "holder": holder, "term": term, "how": how}

        def work(execute: Any) -> bool:
            ours = bool(execute(self.RELEASE, params).rowcount == 1)
            execute(self.END_TERM, params)
            return ours

        try:
            return bool(self._run("cannot release the lease in", work))
        finally:
            self.hand_over()  # the Python API's leader held it itself

    RETIRE = """
        DELETE FROM once_leases
        WHERE name = %(name)s AND (holder IS NULL OR expires_at <= {now})"""
    RETIRE_CANDIDATES = "DELETE FROM once_lead_candidates WHERE name = %(name)s"

    def retire(self, name: str) -> bool | None:
        """Forget a lead name that nobody holds (its terms stay in the history): True when
        retired, False when a live holder has it, None when there is no such name."""
        params = {"name": name}

        def work(execute: Any) -> bool | None:
            if execute(self.PREVIOUS, params).fetchone() is None:
                return None
            if execute(self.RETIRE, params).rowcount != 1:
                return False
            execute(self.RETIRE_CANDIDATES, params)
            return True

        result: bool | None = self._run("cannot retire the lead name in", work)
        return result


# -- the reports' reads, on a connection of their own (a snapshot's)

LEADS = "SELECT name, holder, owner, term, lease_seconds, acquired_at, renewed_at, expires_at " \
        "FROM once_leases ORDER BY name"
CANDIDATES = "SELECT name, seen_at FROM once_lead_candidates"
TERMS = ("SELECT name, term, owner, lease_seconds, started_at, ended_at, ended "
         "FROM once_lead_terms WHERE name = %(name)s ORDER BY term")
ALL_TERMS = ("SELECT name, term, owner, lease_seconds, started_at, ended_at, ended "
             "FROM once_lead_terms ORDER BY name, term")


def read_leads(backend: Dialect, conn: Connection) -> list[Lead]:
    """Every lead name, its holder and waiting candidates; [] on a ledger without the tables
    (no `once lead` has run there)."""
    rows = _read(backend, conn, LEADS, {})
    if not rows:
        return []
    now = backend.from_db(backend.fetch(conn, backend.now_sql, {})[0][0])
    # A candidate stands again every stand_interval(its lease): one seen within three of
    # those (by the name's latest lease) is waiting; an older row is one that went away.
    lease_of = {str(row[0]): float(row[4]) for row in rows}
    waiting: dict[str, int] = {}
    for name, seen in _read(backend, conn, CANDIDATES, {}):
        age = (now - backend.from_db(seen)).total_seconds()
        fresh = age <= 3 * stand_interval(lease_of.get(str(name), 0.0))
        waiting[str(name)] = waiting.get(str(name), 0) + int(fresh)
    return [_lead(backend, row, now, waiting.get(str(row[0]), 0)) for row in rows]


def _lead(backend: Dialect, row: Row, now: datetime, candidates: int) -> Lead:
    name, holder, owner, term, lease, acquired, renewed, expires = row
    return Lead(str(name), None if holder is None else str(owner), int(term), float(lease),
                None if acquired is None else backend.from_db(acquired),
                None if renewed is None else backend.from_db(renewed),
                backend.from_db(expires), now, candidates)


def read_terms(backend: Dialect, conn: Connection, name: str | None = None) -> list[TermRow]:
    """The terms of one lead name (every name's: None), oldest first."""
    rows = _read(backend, conn, TERMS if name is not None else ALL_TERMS, {"name": name})
    return [TermRow(str(r[0]), int(r[1]), str(r[2]), float(r[3]), backend.from_db(r[4]),
                    None if r[5] is None else backend.from_db(r[5]),
                    None if r[6] is None else str(r[6])) for r in rows]


def _read(backend: Dialect, conn: Connection, sql: str, params: Params) -> list[Row]:
    try:
        return backend.fetch(conn, sql, params)
    except Exception as exc:
        if backend.schema_missing(exc, columns=False):
            backend.rollback(conn)
            return []
        raise LedgerError(f"cannot read the leases: {failed_read(backend, exc)}") from exc


# -- the reports' other reads (once.report.leads): status, check, history, metrics

# Whether once_leases is there, asked of PostgreSQL's catalog: a read of a missing table is an
# error there, which its server logs (every `once check` from cron, on a ledger no `once lead`
# has used) and which aborts the snapshot's transaction. The other backends are read directly.
LEASES_KEPT = "SELECT to_regclass('once_leases') IS NOT NULL"
RECENT_TERMS = ("SELECT name, term, owner, lease_seconds, started_at, ended_at, ended "
                "FROM once_lead_terms WHERE name = %(name)s ORDER BY term DESC "
                "LIMIT %(limit)s")
# Per name: terms begun, when the first began, and the seconds the ended ones were held.
_HELD = {"postgresql": "extract(epoch FROM ended_at - started_at)::float8",
         "mysql": "TIMESTAMPDIFF(MICROSECOND, started_at, ended_at) / 1e6",
         "sqlite": "(julianday(ended_at) - julianday(started_at)) * 86400.0"}
TERM_TOTALS = ("SELECT name, count(*), min(started_at), "
               "sum(CASE WHEN ended_at IS NULL THEN 0 ELSE {held} END) "
               "FROM once_lead_terms GROUP BY name")


@dataclass(frozen=True)
class TermTotals:
    """What the terms of one lead name add up to (once_lead_terms)."""

    terms: int  # terms begun
    first_started_at: datetime
    ended_held: float  # seconds the terms that ended were held


def leases_kept(backend: Dialect, conn: Connection) -> bool:
    """Whether the lease tables may be read: False only where PostgreSQL's catalog says
    once_leases is not there (elsewhere the read itself finds out, read_leads)."""
    if backend.name != "postgresql":
        return True
    return bool(backend.fetch(conn, LEASES_KEPT, {})[0][0])


def read_recent_terms(backend: Dialect, conn: Connection, name: str,
                      limit: int) -> list[TermRow]:
    """The `limit` latest terms of one lead name, newest first."""
    rows = _read(backend, conn, RECENT_TERMS, {"name": name, "limit": int(limit)})
    return [TermRow(str(r[0]), int(r[1]), str(r[2]), float(r[3]), backend.from_db(r[4]),
                    None if r[5] is None else backend.from_db(r[5]),
                    None if r[6] is None else str(r[6])) for r in rows]


def read_term_totals(backend: Dialect, conn: Connection) -> dict[str, TermTotals]:
    """Every lead name's TermTotals (one row a name, whatever its terms)."""
    sql = TERM_TOTALS.format(held=_HELD[backend.name])
    return {str(r[0]): TermTotals(int(r[1]), backend.from_db(r[2]), float(r[3] or 0.0))
            for r in _read(backend, conn, sql, {})}
