"""A renewal that failed once is retried before the step-down (torture: connection kills).

`make torture`, connections killed server-side every 0.3-0.8 s: a renewal that found its
connection killed was retried an interval later, which is when the step-down's SIGTERM is due
(--kill-after fits in a third of --stale-after): the retry lost that race nearly every time,
so owners whose ledger answered were stopped (exit 70, "unreachable past the deadline ()")
and the storm never converged. A failed renewal is now retried a quarter of an interval later.
"""

from __future__ import annotations

import os
import time

from once.run import wrapper
from once.run.lease import Lease


def test_a_renewal_that_failed_once_is_retried_before_the_step_down() -> None:
    sent: list[float] = []

    def renew() -> bool:
        sent.append(Lease.now())
        if len(sent) == 1:
            raise OSError("server closed the connection")  # killed while idle
        time.sleep(0.2)  # a fresh connection takes a moment
        return True

    stale = 3.0  # renewals every second; SIGTERM a second before the deadline
    lease = Lease(renew, stale, Lease.now())
    outcome = wrapper.run(["sleep", "4"], dict(os.environ), lease)
    assert (outcome.kind, outcome.status) == ("exited", 0), (outcome, sent, lease.last_error)
    assert len(sent) >= 3 and sent[1] - sent[0] < lease.interval / 2, sent
