"""How each backend's driver says what went wrong, as once reads it: whether a retry may cure
a failure (LedgerError.failure), whether a table or column is not there yet, whether another
transaction won a race (a deadlock, a lost certification) or made the same table at the same
moment. One `Rules` per backend, held by its once.ledger.dialects object; the functions here
are the reading every backend shares.

Imports only the stdlib and once.ledger.records: the rules look at an exception's class names,
SQLSTATE, error code or text, never at a driver's classes, so that no driver is loaded to
classify its errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from once.frozen import Frozen
from once.ledger.records import Failure, error_code, read_only_server

# Whether a retry may cure a failure, per dialect, by the driver's own code: SQLSTATE
# (PostgreSQL; a class of two characters stands for all of its codes), the error number
# (MySQL/MariaDB), the primary result code (SQLite). A code not listed is permanent: the server
# refused the statement, and would refuse it again.
_PG_UNREACHABLE = {"08", "57P01", "57P02", "57P03", "57P05"}  # connection exceptions; a
# connection ended by the server (terminated, a crash, starting up, idle too long)
_PG_TRANSIENT = {"40", "53", "55P03", "55006", "58000", "58030",
                 "25006"}  # rollbacks, resources, locks, I/O, a standby (a failover)
_PG_UNFIT = {"54", "22001", "22021", "22P05"}  # program limits, too long, a character the
# database's encoding lacks (U+FFFD in a LATIN1 database)
_PG_SLOW = {"57014"}  # query_canceled: statement_timeout
_PG_REFUSALS = ("does not exist", "authentication failed", "no pg_hba.conf entry",
                "permission denied")  # a role or database, a password, the server's rules
_MYSQL_UNREACHABLE = {1053, 1077, 1152, 1158, 1159, 1160, 1161, 1184, 1927, 4031}  # the
# network, a shutdown, a connection killed or timed out (and the client's own, 2000-2999)
_MYSQL_TRANSIENT = {1040, 1203, 1226,  # out of connections
                    1205, 1213, 1020, 1180, 1181,  # lock wait, deadlock, commit trouble
                    1290, 1792, 1836, 3032, 1047,  # read-only or offline (a failover), Galera
                    1021, 1037, 1038, 1041, 1114, 1135, 1317}  # disk, memory, interrupted
_MYSQL_UNFIT = {1153, 1301, 1406, 1366}  # max_allowed_packet, too long, not in the charset
_MYSQL_SLOW = {1969, 3024}  # max_statement_time (MariaDB), max_execution_time (MySQL)
_SQLITE_TRANSIENT = {5, 6, 7, 9, 10, 13, 14, 15, 17}  # busy, locked, memory, I/O, full...
_SQLITE_UNFIT = {18}  # SQLITE_TOOBIG
# Without a code, DB-API's classes: OperationalError and InterfaceError are the connection's
# (psycopg's lost connection, PyMySQL's closed one); DataError, ProgrammingError and the rest
# the statement's.
_CONNECTION = {"OperationalError", "InterfaceError", "ConnectionTimeout", "TimeoutError"}
_KINDS: tuple[Failure, ...] = ("unreachable", "transient", "unfit", "slow")

# A statement that names a table or a column the ledger does not have yet (its first use, or
# a schema older than this once's), as each driver says it.
_UNDEFINED_SQLSTATES = {"42P01": "table", "42703": "column"}  # PostgreSQL
_UNDEFINED_MYSQL = {1146: "table", 1054: "column"}  # MySQL, MariaDB
_UNDEFINED_SQLITE = {"no such table": "table", "no such column": "column",
                     "has no column": "column"}

# What a MySQL-family server answers a creation or upgrade that another node of a Galera
# cluster ran at the same moment (GET_LOCK is the node's own, not the cluster's; DDL runs on
# every node in one total order): the table, column, index or CHECK is there already (1050,
# 1060, 1061; 1826 MariaDB's, 3822 MySQL's CHECK), the column it renames is gone (1054), the
# version row is there (1062), the table is being changed (1684, the inspector's read), or the
# other node's write won certification (1213). Each means "made elsewhere": look again, and
# create only what is still missing.
_MADE_ELSEWHERE = {1050, 1054, 1060, 1061, 1062, 1213, 1684, 1826, 3822}
# A transaction another one's rolled back: MySQL's deadlock (Galera's lost certification
# too) and lock wait; PostgreSQL's serialization failure and deadlock.
_MYSQL_RACES = {1213, 1205}
_MYSQL_LOCK_WAIT = 1205  # innodb_lock_wait_timeout: another transaction held the row
_MYSQL_LOST = 2013  # "Lost connection to MySQL server during query", "(timed out)": PyMySQL's
# read timeout
_PG_RACES = {"40001", "40P01"}


class Rules(Frozen):
    """One backend's reading of its driver's errors."""

    coded: Callable[[BaseException], Failure | None]  # by the driver's code; None: no code
    lost_connection: Failure  # a connection's error without a code
    missing: Callable[[BaseException], str | None]  # "table", "column" or None
    races: Callable[[BaseException], bool]
    made_elsewhere: Callable[[BaseException], bool]
    waited_on: Callable[[BaseException], str]  # the lock a statement waited on, or ""
    timed_out: Callable[[BaseException], bool]  # a read the client gave up on (no answer)

    def __init__(self, coded: Callable[[BaseException], Failure | None],
                 lost_connection: Failure, missing: Callable[[BaseException], str | None],
                 races: Callable[[BaseException], bool] = lambda exc: False,
                 made_elsewhere: Callable[[BaseException], bool] = lambda exc: False,
                 waited_on: Callable[[BaseException], str] = lambda exc: "",
                 timed_out: Callable[[BaseException], bool] = lambda exc: False) -> None:
        self._set(coded=coded, lost_connection=lost_connection, missing=missing, races=races,
                  made_elsewhere=made_elsewhere, waited_on=waited_on, timed_out=timed_out)


def failure(rules: Rules, exc: BaseException) -> Failure:
    """Whether a retry may cure the driver's exception `exc` (see LedgerError.failure): the
    one place that reads it, for every dialect."""
    if isinstance(exc, OSError):
        return "unreachable"  # the socket's
    if isinstance(exc, UnicodeEncodeError):
        return "unfit"  # the connection's encoding lacks a character (psycopg, a LATIN1 db)
    if read_only_server(exc):
        return "transient"  # a standby, until a failover promotes it
    coded = rules.coded(exc)
    if coded is not None:
        return coded
    if any(cls.__name__ in _CONNECTION for cls in type(exc).__mro__):
        return rules.lost_connection
    return "permanent"


def schema_missing(rules: Rules, exc: BaseException, columns: bool = True) -> bool:
    """The statement failed for a table (or, with `columns`, a column) that is not there yet:
    once.ledger.schema creates or upgrades the tables, then the statement is tried again (or,
    for a read, nothing has run yet). `exc` is the driver's exception."""
    missing = rules.missing(exc)
    return missing == "table" or (columns and missing == "column")


# A server that is up but answers no statement on the ledger: a Galera node outside the
# Primary component, or one refusing queries (wsrep_reject_queries): MySQL's 1047 "WSREP has
# not yet prepared node for application use". What it holds cannot be told from it.
_MYSQL_NOT_READY = {1047}


def not_ready(exc: BaseException) -> bool:
    """exc, or the driver's error it was raised from (a LedgerError's cause), is a server
    that cannot answer for the ledger now (_MYSQL_NOT_READY)."""
    seen: BaseException | None = exc
    while seen is not None:
        if error_code(seen) in _MYSQL_NOT_READY:
            return True
        seen = seen.__cause__
    return False


def lost_race(rules: Rules, exc: BaseException) -> bool:
    return rules.races(exc)


def read_timed_out(rules: Rules, exc: BaseException) -> bool:
    """The client gave up waiting for the statement's answer (its read timeout): the server
    may still be at it, or have done it. A claim tries again, and learns from the row whether
    it had (once.ledger.mysql: a Galera cluster's failure detection holds commits for
    seconds); any other statement takes it as the server unreachable."""
    return rules.timed_out(exc)


def lock_waited(rules: Rules, exc: BaseException) -> str:
    """What the statement that failed with `exc` had waited on until its bound (a lock
    timeout, a cancel, our watchdog's): "a row lock" (another session held it: a `once:` line
    says so, not "unreachable"); "" when it was not waiting on a lock."""
    return rules.waited_on(exc)


def made_elsewhere(rules: Rules, exc: BaseException) -> bool:
    return rules.made_elsewhere(exc)


def _by_code(code: object, sets: tuple[set[Any], ...]) -> Failure | None:
    return next((kind for kind, codes in zip(_KINDS, sets, strict=True) if code in codes),
                None)


# -- PostgreSQL: SQLSTATE


def _pg_coded(exc: BaseException) -> Failure | None:
    state = getattr(exc, "sqlstate", None)
    sets = (_PG_UNREACHABLE, _PG_TRANSIENT, _PG_UNFIT, _PG_SLOW)
    if state:
        return _by_code(state[:2], sets) or _by_code(state, sets) or "permanent"
    if "FATAL:" in str(exc) and any(words in str(exc) for words in _PG_REFUSALS):
        return "permanent"  # a connection refused for good: libpq gives no SQLSTATE
    return None


def _pg_waited_on(exc: BaseException) -> str:
    """A lock timeout (55P03), or any error raised while the statement waited for another
    transaction's row, whose context then names the tuple ("while updating tuple (0,1) in
    relation ..."): a cancel at the statement's bound, a statement timeout."""
    context = getattr(getattr(exc, "diag", None), "context", None) or ""
    if context.startswith("while ") and " tuple" in context:
        return "a row lock"
    return "a lock" if getattr(exc, "sqlstate", None) == "55P03" else ""


POSTGRES = Rules(
    _pg_coded, "unreachable",
    lambda exc: _UNDEFINED_SQLSTATES.get(getattr(exc, "sqlstate", None) or ""),
    races=lambda exc: getattr(exc, "sqlstate", None) in _PG_RACES, waited_on=_pg_waited_on)


CANCELLED = "57014"  # query_canceled: a cancel request, or the server's statement_timeout


class Cancelled(Exception):
    """A statement once's watchdog cancelled at its limit: the server's words for it
    ("canceling statement due to user request") blame a user. The driver's SQLSTATE and
    diagnostics stay, so that it is read as the server's own cancel is (slow; the row lock it
    waited on, where the server names one: _pg_waited_on)."""

    def __init__(self, exc: BaseException, limit: float, cut: bool = False) -> None:
        self.sqlstate = CANCELLED
        self.diag = getattr(exc, "diag", None)
        # cut: the limit was what was left before the statement's bound (a lease's deadline,
        # the final write's): its seconds, the last try's share, would mislead.
        limit_said = ("the bound it had (the lease's deadline, or the final write's), so once "
                      "cancelled it" if cut else
                      f"once's limit of {limit:.3g}s for a statement, so once cancelled it")
        lock = _pg_waited_on(exc)
        if lock:
            super().__init__(f"waited on {lock} held by another session past {limit_said}")
        else:  # an advisory or a table lock, or the server's own pace: it does not say which
            super().__init__(f"no answer within {limit_said} (waiting on a lock another "
                             f"session holds, or a server that slow)")


# -- MySQL and MariaDB: the error number


def _mysql_coded(exc: BaseException) -> Failure | None:
    code = error_code(exc)
    if code and 2000 <= code < 3000:
        return "unreachable"  # the client's: lost, gone away, cannot connect
    if code:
        return _by_code(code, (_MYSQL_UNREACHABLE, _MYSQL_TRANSIENT, _MYSQL_UNFIT,
                               _MYSQL_SLOW)) or "permanent"
    return None


MYSQL = Rules(
    _mysql_coded, "unreachable", lambda exc: _UNDEFINED_MYSQL.get(error_code(exc) or 0),
    races=lambda exc: error_code(exc) in _MYSQL_RACES,
    made_elsewhere=lambda exc: error_code(getattr(exc, "orig", None) or exc) in _MADE_ELSEWHERE,
    waited_on=lambda exc: "a row lock" if error_code(exc) == _MYSQL_LOCK_WAIT else "",
    timed_out=lambda exc: error_code(exc) == _MYSQL_LOST and str(exc.args[-1]).endswith(
        "(timed out)"))


# -- SQLite: the primary result code, and the message


def _sqlite_coded(exc: BaseException) -> Failure | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return _by_code(code & 0xFF, (set(), _SQLITE_TRANSIENT, _SQLITE_UNFIT, set())) \
            or "permanent"
    return None


def _sqlite_missing(exc: BaseException) -> str | None:
    text = str(exc)
    return next((what for words, what in _UNDEFINED_SQLITE.items() if words in text), None)


def _sqlite_waited_on(exc: BaseException) -> str:
    """SQLITE_BUSY, SQLITE_LOCKED: another connection held the database's write lock past
    the busy timeout."""
    code = getattr(exc, "sqlite_errorcode", None)
    return "the database's write lock" if isinstance(code, int) and code & 0xFF in (5, 6) \
        else ""


SQLITE = Rules(_sqlite_coded, "transient", _sqlite_missing,  # one writer: busy, not lost
               waited_on=_sqlite_waited_on)
