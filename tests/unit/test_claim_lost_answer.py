"""Which driver errors mean a claim's answer was lost, the statement perhaps done (the client's
read timeout: once.ledger.mysql tries the claim again and looks for its own row), as opposed
to a connection that is gone or a refusal (issue 34, row 11)."""

from __future__ import annotations

import pymysql
import pytest

from once.ledger.dialects import named


@pytest.mark.parametrize(("exc", "lost"), [
    (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query "
                                        "(timed out)"), True),
    # The server went away, or closed it: no answer is on its way.
    (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"), False),
    (pymysql.err.OperationalError(2006, "MySQL server has gone away (timed out)"), False),
    (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), False),
    (pymysql.err.InterfaceError(0, ""), False),
    (TimeoutError("timed out"), False),
])
def test_mysql_reads_a_lost_answer(exc: BaseException, lost: bool) -> None:
    assert named("mysql").read_timed_out(exc) is lost


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_other_dialects_never_retry_a_claim_on_it(dialect: str) -> None:
    assert not named(dialect).read_timed_out(TimeoutError("timed out"))
