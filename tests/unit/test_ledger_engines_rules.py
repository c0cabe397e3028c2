"""once.ledger.engines' rules that need no database: which error means "nothing has run here
yet", and how an instant is bound per dialect."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from once.ledger import engines, parse_url


class _Wrapped(Exception):
    """SQLAlchemy's DBAPIError as is_missing_table sees it: the driver's error in .orig."""

    def __init__(self, orig: BaseException | None) -> None:
        super().__init__("wrapped")
        self.orig = orig


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__("relation does not exist")
        self.sqlstate = sqlstate


SQLITE, POSTGRES, MYSQL = (parse_url("sqlite:///tmp/x.db"),
                           parse_url("postgresql://u@h/db"), parse_url("mysql://u@h/db"))


@pytest.mark.parametrize(("target", "orig", "missing"), [
    (SQLITE, Exception("no such table: once_meta"), True),
    (SQLITE, Exception("no such column: shards"), False),  # a column: the schema is there
    (SQLITE, Exception("database is locked"), False),
    (POSTGRES, _PgError("42P01"), True),
    (POSTGRES, _PgError("42703"), False),
    (MYSQL, Exception(1146, "Table 'db.once_meta' doesn't exist"), True),
    (MYSQL, Exception(1054, "Unknown column"), False),
    (MYSQL, Exception(2013, "Lost connection"), False),
    (SQLITE, None, False),  # not a driver's error at all
])
def test_is_missing_table(target: object, orig: BaseException | None, missing: bool) -> None:
    assert engines.is_missing_table(target, _Wrapped(orig)) is missing  # type: ignore[arg-type]


def test_bind_is_naive_utc_outside_postgresql() -> None:
    instant = datetime(2026, 12, 1, 4, 0, tzinfo=timezone(timedelta(hours=1)))
    assert engines.bind(SQLITE, instant) == datetime(2026, 12, 1, 3, 0)
    assert engines.bind(MYSQL, instant) == datetime(2026, 12, 1, 3, 0)
    bound = engines.bind(POSTGRES, instant)
    assert bound == instant and bound.tzinfo is UTC
