"""What a step-down does to the lease: it keeps the reason it names (a renewal still out
got no answer; an error seen before stays), and no renewal goes out from then on."""

from __future__ import annotations

import threading

from once.run.lease import Lease


def _renewal_in_flight(answer: threading.Event) -> tuple[Lease, threading.Thread]:
    """A lease whose renewal has been sent and waits for `answer` (then the row is ours)."""
    sent = threading.Event()

    def renew() -> bool:
        sent.set()
        answer.wait(30)
        return True

    lease = Lease(renew, 3.0, Lease.now())
    renewal = threading.Thread(target=lease.renew_once)
    renewal.start()
    assert sent.wait(30)
    return lease, renewal


def test_a_renewal_still_out_got_no_answer() -> None:
    answer = threading.Event()
    lease, renewal = _renewal_in_flight(answer)
    try:
        lease.step_down_reason()
    finally:
        answer.set()
        renewal.join(30)
    assert (lease.failure, lease.overslept) == ("no-answer", False)
    assert lease.last_error == "a renewal got no answer from the ledger"


def test_a_step_down_keeps_its_reason_when_a_renewal_out_gets_through_late() -> None:
    answer = threading.Event()
    lease, renewal = _renewal_in_flight(answer)
    lease.last_error = "server closed the connection"  # what an earlier renewal met
    lease.step_down_reason()  # the command is being stopped
    answer.set()  # ... and then the renewal out gets through, before the deadline
    renewal.join(30)
    assert lease.last_error == "server closed the connection"


def test_no_renewal_is_sent_once_the_owner_steps_down() -> None:
    """A stopped owner's late answer could otherwise be followed by one more renewal, which
    would hold the row alive a promise longer while its command is being stopped."""
    sent: list[float] = []
    lease = Lease(lambda: bool(sent.append(Lease.now())) or True, 3.0, Lease.now())
    lease.step_down_reason()
    assert not lease.renew_once() and sent == []
