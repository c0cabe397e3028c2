"""A catch-up's new kept guard is awaited (once.run.keeper) before the command starts, with no
heartbeat running: the wrapper renews the claim while it waits (once.run.wrapper._beat), so that
a guard slow to say hello (a loaded machine, a SIGSTOP) does not let a short --stale-after
lapse and leave the period held by nobody. On a fake clock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from once.run import keeper, lease, wrapper
from once.run.keeper import HELLO_WAIT, Keeper
from once.run.lease import Lease


class Clock:
    """The one clock of the lease, the wrapper and the keeper; a guard that says hello at
    `hello_at` (None: never), written into the report pipe when the wait reaches it."""

    def __init__(self, hello_at: float | None) -> None:
        self.now = 0.0
        self.hello_at = hello_at
        self.guard_end = -1  # the report pipe's write end, the guard's

    def ready(self, report: int, timeout: float) -> set[int]:
        if self.hello_at is not None and self.now + timeout >= self.hello_at:
            self.now = max(self.now, self.hello_at)
            os.write(self.guard_end, b"hello\n")
            self.hello_at = None
            return {report}
        self.now += timeout
        return set()


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    os.close(read)
    os.close(write)


def _awaiting(monkeypatch: pytest.MonkeyPatch, clock: Clock, report: tuple[int, int]) -> Keeper:
    """A Keeper whose guard was started and has not said hello yet."""
    clock.guard_end = report[1]
    now = lambda: clock.now  # noqa: E731
    monkeypatch.setattr(wrapper, "lease_now", now)
    monkeypatch.setattr(lease, "lease_now", now)
    monkeypatch.setattr(keeper, "time", SimpleNamespace(monotonic=now))
    monkeypatch.setattr(keeper._guard, "ready",
                        lambda fds, timeout: clock.ready(fds[0], timeout) if fds else set())
    kept = Keeper()
    kept.report = report[0]
    return kept


@pytest.mark.parametrize("hello_at", [0.5, 2.5, 4.5])
def test_the_claim_is_renewed_while_a_slow_guard_starts(monkeypatch: pytest.MonkeyPatch,
                                                        pipe: tuple[int, int],
                                                        hello_at: float) -> None:
    clock = Clock(hello_at)
    kept = _awaiting(monkeypatch, clock, pipe)
    renewals: list[float] = []
    claim = Lease(lambda: renewals.append(clock.now) or True, 3.0, 0.0)

    assert kept._hello(wrapper._beat(claim))
    assert clock.now == hello_at
    # Renewed every interval (1 s) until the hello, and alive when it came.
    assert renewals == [float(n) for n in range(1, int(hello_at) + 1)]
    assert not claim.expired and not claim.lost
    assert wrapper._fresh(claim, 0.5)


def test_a_guard_that_never_says_hello_is_given_up_at_the_bound(monkeypatch: pytest.MonkeyPatch,
                                                                 pipe: tuple[int, int]) -> None:
    clock = Clock(None)
    kept = _awaiting(monkeypatch, clock, pipe)
    claim = Lease(lambda: True, 3.0, 0.0)

    assert not kept._hello(wrapper._beat(claim))
    assert clock.now == pytest.approx(HELLO_WAIT)
    assert not claim.expired  # the period falls back to a forked guard, its claim alive


def test_a_lost_claim_is_not_renewed_while_waiting(monkeypatch: pytest.MonkeyPatch,
                                                   pipe: tuple[int, int]) -> None:
    clock = Clock(2.5)
    kept = _awaiting(monkeypatch, clock, pipe)
    renewals: list[float] = []

    def renew() -> bool:
        renewals.append(clock.now)
        return False  # the row is no longer ours

    claim = Lease(renew, 3.0, 0.0)
    assert kept._hello(wrapper._beat(claim))
    assert renewals == [1.0] and claim.lost
    assert not wrapper._fresh(claim, 0.5)  # its command is not started


def test_without_a_lease_the_wait_is_the_bound_alone(monkeypatch: pytest.MonkeyPatch,
                                                     pipe: tuple[int, int]) -> None:
    clock = Clock(3.0)
    kept = _awaiting(monkeypatch, clock, pipe)
    assert wrapper._beat(None) is None
    assert kept._hello(None)
    assert clock.now == 3.0
