"""The statement watchdog's thread (once.ledger.watchdog) is woken only for a statement whose
deadline comes before the one it waits for: a catch-up's statements, whose deadlines all lie
beyond it, leave it asleep; and a statement with an earlier deadline is still cancelled, then
its socket shut down, on time (a real watcher thread and real sockets)."""

from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

from once.ledger.watchdog import _StatementWatchdog


class _Counted(threading.Condition):
    """A condition that counts the times the watcher is told to look again."""

    told = 0

    def notify(self, n: int = 1) -> None:
        self.told += 1
        super().notify(n)


def _asleep_until(watchdog: _StatementWatchdog, wakes_at: float) -> _Counted:
    """The watchdog as it is while its watcher waits until wakes_at (no thread here)."""
    changed = _Counted()
    watchdog._changed, watchdog._watching, watchdog._wakes_at = changed, True, wakes_at
    return changed


def test_only_an_earlier_deadline_wakes_the_watcher() -> None:
    watchdog = _StatementWatchdog()
    waits_for = time.monotonic() + 20.0
    changed = _asleep_until(watchdog, waits_for)
    watchdog.disarm(watchdog.arm(-1, 30.0, 40.0, lambda: None))  # a catch-up's statement
    assert changed.told == 0 and watchdog._wakes_at == waits_for
    watchdog.arm(-1, 5.0, 6.0, lambda: None)  # sooner: it must look before then
    assert changed.told == 1 and watchdog._wakes_at < waits_for
    changed = _asleep_until(watchdog, math.inf)  # nothing armed: it waits to be told
    watchdog.arm(-1, 30.0, 40.0, lambda: None)
    assert changed.told == 1


def test_an_earlier_statement_is_cancelled_and_shut_down_on_time() -> None:
    watchdog = _StatementWatchdog()
    ours, theirs = socket.socketpair()
    cancelled: dict[str, Any] = {"late": threading.Event(), "early": threading.Event()}
    try:
        late = watchdog.arm(ours.fileno(), 30.0, 40.0, cancelled["late"].set)
        later = watchdog.arm(ours.fileno(), 60.0, 70.0, cancelled["late"].set)
        early = watchdog.arm(ours.fileno(), 0.1, 0.2, cancelled["early"].set)
        assert cancelled["early"].wait(10), "the earlier statement was never cancelled"
        theirs.settimeout(10)
        assert theirs.recv(1) == b""  # its socket shut down at its second limit
        assert watchdog.disarm(early)  # its cancel was sent
        assert not cancelled["late"].is_set()
        assert not watchdog.disarm(late) and not watchdog.disarm(later)
    finally:
        ours.close()
        theirs.close()
