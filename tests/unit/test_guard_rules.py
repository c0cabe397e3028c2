"""The guard's watch of the lease's deadline (once.run.guard: renewed, due, wake_at), on a
fake clock: no sleeps, no processes. The guard steps down on its own when its wrapper cannot
(stopped, wedged): SIGTERM to the group the grace before the deadline, SIGKILL at it, the
deadline moved only by the wrapper's renewals and never once the step-down began.
tests/integration/test_guard.py and test_liveness.py prove it with a stopped wrapper."""

from __future__ import annotations

import signal

from once.run.guard import due, renewed, wake_at

DEADLINE, GRACE = 106.0, 1.0


def test_nothing_is_due_before_the_grace() -> None:
    assert due(DEADLINE, GRACE, False, 104.99) is None
    assert wake_at(DEADLINE, GRACE, False) == 105.0


def test_sigterm_the_grace_before_the_deadline_then_sigkill_at_it() -> None:
    assert due(DEADLINE, GRACE, False, 105.0) == signal.SIGTERM
    assert due(DEADLINE, GRACE, True, 105.5) is None  # sent once
    assert wake_at(DEADLINE, GRACE, True) == DEADLINE
    assert due(DEADLINE, GRACE, True, DEADLINE) == signal.SIGKILL


def test_a_watch_woken_past_the_deadline_kills_at_once() -> None:
    # A suspend that outlasted the lease: no SIGTERM first, the deadline has passed.
    assert due(DEADLINE, GRACE, False, 500.0) == signal.SIGKILL


def test_a_renewal_moves_the_deadline_forward_only() -> None:
    assert renewed(DEADLINE, False, [b"107.5", b"109.25"]) == 109.25  # the latest line
    assert renewed(DEADLINE, False, [b"90.0"]) == DEADLINE  # never earlier
    assert renewed(DEADLINE, False, []) == DEADLINE


def test_a_renewal_read_once_stopping_does_not_undo_the_step_down() -> None:
    assert renewed(DEADLINE, True, [b"200.0"]) == DEADLINE
    assert due(DEADLINE, GRACE, True, DEADLINE) == signal.SIGKILL
