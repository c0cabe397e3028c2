"""The DB-API as once calls it, for annotations alone: a connection and its cursor (sqlite3,
psycopg 3, PyMySQL), a statement's parameters and a row.

Nothing here runs: every module imports it under TYPE_CHECKING, so `once run` never loads it.
Where only one driver's connection can be (a dialect's own ledger), its own type is named
(sqlite3.Connection, psycopg.Connection); these are for the paths every dialect shares, and
for PyMySQL, which has no types of its own.
"""

from __future__ import annotations

import socket
from typing import Any, Protocol, TypeAlias

# A row as a driver reads it: each value is its column's, as that driver reads the column's
# type (str, int, float, datetime, None; SQLite's times as text), which the reader knows.
Row: TypeAlias = tuple[Any, ...]
# A statement's values by name (%(name)s, sqlite3's :name): whatever the statement binds, and
# what the code that set a value reads back.
Params: TypeAlias = dict[str, Any]


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Params = ..., /) -> object: ...

    def fetchone(self) -> Row | None: ...

    def fetchall(self) -> list[Row]: ...

    def close(self) -> None: ...


class Connection(Protocol):
    def cursor(self) -> Cursor: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


class MysqlCursor(Cursor, Protocol):
    """PyMySQL's cursor, as MysqlLedger uses it."""

    lastrowid: int  # the LAST_INSERT_ID() a statement set (a fence, an attempt, a version)

    def execute(self, sql: str, params: Params = ..., /) -> int: ...  # the rows it matched

    def mogrify(self, sql: str, params: Params = ..., /) -> str: ...

    def __enter__(self) -> MysqlCursor: ...

    def __exit__(self, *exc: object) -> None: ...


class MysqlConnection(Connection, Protocol):
    """PyMySQL's connection, as MysqlLedger uses it."""

    open: bool
    server_status: int
    _sock: socket.socket  # its socket (once serve's watchdog shuts it down)

    def cursor(self) -> MysqlCursor: ...

    def autocommit(self, value: bool) -> None: ...

    def get_server_info(self) -> str: ...
