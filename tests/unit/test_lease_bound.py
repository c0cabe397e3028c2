"""A renewal waits on the ledger no longer than its lease (once.deadlines.statements_until,
once.ledger.watchdog.bounded), a lock another session held is named as such, and an owner
that was stopped with a renewal out says it was stopped: on an injected lease clock."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from once import deadlines
from once.ledger import errors, watchdog
from once.ledger.dialects import named
from once.ledger.records import LedgerError
from once.run import attempt, lease
from once.run.lease import STALLED, Lease


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(watchdog, "lease_now", fake)
    monkeypatch.setattr(lease, "lease_now", fake)
    return fake


def test_a_statement_outside_a_bound_keeps_its_limits(clock: Clock) -> None:
    assert watchdog.bounded(3.75, 5.0) == (3.75, 5.0)
    with deadlines.statements_until(clock.now + 60):  # far: the limits come first
        assert watchdog.bounded(3.75, 5.0) == (3.75, 5.0)


def test_a_bounded_statement_is_cancelled_before_its_bound_and_shut_at_it(clock: Clock) -> None:
    # --stale-after 3s: limits of 3.75 s and 5 s, a renewal sent 2 s before the deadline.
    with deadlines.statements_until(clock.now + 2.0):
        cancel, shut = watchdog.bounded(3.75, 5.0)
    assert (cancel, shut) == (2.0 - watchdog.CANCEL_ANSWER, 2.0)
    with deadlines.statements_until(clock.now + 0.6):  # a renewal sent late: a chance still
        assert watchdog.bounded(3.75, 5.0) == pytest.approx((0.3, 0.6))
    with deadlines.statements_until(clock.now - 1.0):  # already past: at once
        assert watchdog.bounded(3.75, 5.0) == (0.0, 0.0)
    assert deadlines.statement_bound() is None  # the block's end lifts it


def test_bounds_nest_to_the_nearer(clock: Clock) -> None:
    with deadlines.statements_until(clock.now + 2), deadlines.statements_until(clock.now + 9):
        assert deadlines.statement_bound() == clock.now + 2


def test_a_renewal_is_bounded_by_its_lease(clock: Clock) -> None:
    seen: list[float | None] = []

    def renew() -> bool:
        seen.append(deadlines.statement_bound())
        return True

    renewal = Lease(renew, 3.0, clock.now)
    clock.now += 1.0
    assert renewal.renew_once()
    assert seen == [1003.0]  # the deadline it renewed from, not the one it renews to


def _stepped_down(clock: Clock, renewed: bool, late: float, overslept: float = 0.0) -> Lease:
    owner = Lease(lambda: True, 3.0, clock.now)
    if renewed:
        clock.now += 1.0
        owner.last_sent = clock.now  # a renewal went out (its answer never came)
    owner.lock.acquire()  # ... and is still in the ledger
    clock.now = owner.deadline + late
    owner.step_down_reason(overslept)
    owner.lock.release()
    return owner


def test_a_step_down_in_time_with_a_renewal_out_got_no_answer(clock: Clock) -> None:
    owner = _stepped_down(clock, renewed=True, late=-1.0)  # at the SIGTERM, before it
    assert (owner.failure, owner.overslept) == ("no-answer", False)


def test_a_step_down_past_the_deadline_says_the_owner_was_stopped(clock: Clock) -> None:
    owner = _stepped_down(clock, renewed=True, late=STALLED + 1.0)
    assert owner.overslept and owner.failure == ""
    assert owner.last_error == ("its deadline passed while this process was stopped or "
                                "suspended (it stepped down 2.0s after it)")
    # What the renewal out meets once the process runs again does not undo it.
    owner.lock.acquire()
    owner.lock.release()
    assert not owner.renew_once() and owner.last_error.startswith("its deadline passed while")


def test_a_wait_that_overran_past_the_deadline_says_the_owner_was_stopped(clock: Clock) -> None:
    # Stopped with a renewal out and woken just past the deadline (the guard had ended the
    # command by it): the renewal got no answer because nothing of this process ran.
    owner = _stepped_down(clock, renewed=True, late=0.2, overslept=STALLED + 4.0)
    assert owner.overslept and owner.failure == ""
    assert owner.last_error == ("its deadline passed while this process was stopped or "
                                "suspended (it woke 5.0s late)")


def test_a_wait_that_overran_before_the_deadline_is_no_stop_yet(clock: Clock) -> None:
    # Woken late at the step-down's SIGTERM, the deadline still ahead: the renewal out may
    # yet be answered, and nothing says the deadline passed.
    owner = _stepped_down(clock, renewed=True, late=-0.5, overslept=STALLED + 4.0)
    assert (owner.failure, owner.overslept) == ("no-answer", False)


def test_a_wait_that_overran_a_little_is_no_stop(clock: Clock) -> None:
    owner = _stepped_down(clock, renewed=True, late=0.2, overslept=STALLED / 2)
    assert (owner.failure, owner.overslept) == ("no-answer", False)


def test_a_claim_answered_late_is_no_stop(clock: Clock) -> None:
    owner = Lease(lambda: True, 3.0, clock.now)
    clock.now = owner.deadline + STALLED + 1.0  # no renewal ever went out
    owner.step_down_reason()
    assert owner.last_error.startswith("its deadline passed before this process could renew")


def _ledger_error(failure: str, lock: str) -> LedgerError:
    error = LedgerError("cannot renew the claim in the ledger x: canceling statement")
    error.failure, error.lock = failure, lock  # type: ignore[assignment]
    return error


def test_a_lock_another_session_held_is_named(clock: Clock) -> None:
    def renew() -> bool:
        raise _ledger_error("slow", "a row lock")

    owner = Lease(renew, 3.0, clock.now)
    assert not owner.renew_once()
    assert (owner.failure, owner.waited_on) == ("locked", "a row lock")
    assert attempt.trouble(owner, "the renewals") == (
        "the renewals waited on a row lock held by another session")


class _PgError(Exception):
    def __init__(self, sqlstate: str, context: str | None) -> None:
        super().__init__("canceling statement")
        self.sqlstate, self.diag = sqlstate, SimpleNamespace(context=context)


@pytest.mark.parametrize(("exc", "waited_on"), [
    (_PgError("57014", 'while updating tuple (0,1) in relation "once_runs"'), "a row lock"),
    (_PgError("55P03", 'while locking tuple (3,7) in relation "once_jobs"'), "a row lock"),
    (_PgError("55P03", None), "a lock"),  # a table's, say
    (_PgError("57014", None), ""),  # a statement that was slow, not waiting
    (_PgError("40P01", None), ""),  # a deadlock: a race, retried as one
])
def test_postgresql_names_the_lock_a_statement_waited_on(exc: Exception,
                                                         waited_on: str) -> None:
    assert named("postgresql").lock_waited(exc) == waited_on


def test_mysql_names_a_lock_wait_timeout() -> None:
    import pymysql

    assert named("mysql").lock_waited(pymysql.err.OperationalError(1205, "Lock wait")) == \
        "a row lock"
    assert named("mysql").lock_waited(pymysql.err.OperationalError(2013, "Lost")) == ""


def test_sqlite_names_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (i)")
    holder.execute("BEGIN IMMEDIATE")
    waiter = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as busy:
        waiter.execute("INSERT INTO t VALUES (1)")
    holder.execute("ROLLBACK")
    holder.close()
    waiter.close()
    assert errors.lock_waited(errors.SQLITE, busy.value) == "the database's write lock"
    assert named("sqlite").lock_waited(sqlite3.OperationalError("no such table")) == ""


def _supervised(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> tuple[Lease, object]:
    from once.run import wrapper

    monkeypatch.setattr(wrapper, "lease_now", clock)
    owner = Lease(lambda: True, 6.0, clock.now)
    clock.now += 1.0
    assert owner.renew_once()  # renewals have begun: deadline 1007
    return owner, wrapper._Supervisor(owner, 2.0, None)


def test_a_heartbeat_woken_late_past_the_step_down_sends_nothing_and_names_the_stop(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stopped between renewals and continued after the guard's SIGTERM (a grace before the
    # deadline) but before the deadline: the renewal now due would hold the period for a
    # command being stopped, and (sent) reset the loop's overrun that names the stop.
    from once.run import machine

    owner, supervisor = _supervised(clock, monkeypatch)
    sent, due = owner.last_sent, owner.next_renewal(True)
    clock.now = owner.deadline - 0.5
    assert supervisor._stalled_past_step_down(clock.now - due)  # type: ignore[attr-defined]
    assert owner.last_sent == sent  # nothing sent
    supervisor._perform([machine.StepDown()])  # type: ignore[attr-defined]
    assert owner.last_error.startswith("its deadline passed before this process could renew")
    clock.now = owner.deadline + 0.2  # or woken just past the deadline: the overrun names it
    owner.last_error, owner.stepping_down, owner.overslept = "", False, False
    supervisor._perform([machine.StepDown()])  # type: ignore[attr-defined]
    assert owner.last_error == ("its deadline passed while this process was stopped or "
                                "suspended (it woke 3.5s late)")


def test_a_heartbeat_woken_late_before_the_step_down_renews(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, supervisor = _supervised(clock, monkeypatch)
    due = owner.next_renewal(True)
    clock.now = due + STALLED + 0.5  # starved, but the step-down's moment is still ahead
    assert not supervisor._stalled_past_step_down(clock.now - due)  # type: ignore[attr-defined]
    clock.now = owner.deadline - 1.0  # past it, on time (a renewal that failed before)
    assert not supervisor._stalled_past_step_down(0.1)  # type: ignore[attr-defined]
