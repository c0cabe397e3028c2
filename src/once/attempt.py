"""What the owner of a claimed attempt writes to the ledger once its command has ended: the
fenced final write (retried past the lease's deadline) and a fenced-out attempt's output; and
the renewal its lease calls. Shared by `once run` (once.core) and the Python API (once.api).
No SQL here: it asks the ledger by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from once.lease import Lease, NoAnswer
from once.ledger import Claim, Job, Ledger, LedgerError
from once.outcomes import History, Status
from once.relay import text


def renewal(ledger: Ledger, job: str, key: str, attempt: int,
            finished: Callable[[], bool] = lambda: False) -> Callable[[], bool]:
    """The lease's renewal of our attempt: True while the row is ours (and once finished()
    says nothing is left to keep alive). A failed renewal closes the connection, so that
    the next opens a fresh one."""
    def renew() -> bool:
        if finished():
            return True
        try:
            return ledger.renew(job, key, attempt)
        except LedgerError:
            ledger.close()
            raise

    return renew


def keep_output(ledger: Ledger, job: Job, key: str, claim: Claim, output: bytes | None,
                lease: Lease) -> None:
    """A fenced-out attempt's output, into its own attempt row (`once logs` shows what it
    said before it was stopped): best effort, one bounded statement, never an error."""
    if output is None:
        return
    try:
        lease.call(lambda: ledger.keep_output(job.name, key, claim.attempt, text(output)),
                   until=lease.now())
    except NoAnswer:
        ledger.abandon()  # the statement still waits on the connection: never close it
    except LedgerError:
        pass


# How long a final write is retried past the lease's deadline: --stale-after, at least 30 s
# and at most 10 minutes. The write is fenced (it names our attempt and a running row), so
# trying longer is safe: until another attempt takes the row over, a write that lands records
# what really happened and the period is not run again; after a takeover it matches no row.
FINISH_GRACE_MIN, FINISH_GRACE_MAX = 30.0, 600.0


def finish_grace(stale_after: float) -> float:
    return max(FINISH_GRACE_MIN, min(FINISH_GRACE_MAX, stale_after))


def record_result(ledger: Ledger, job: Job, key: str, claim: Claim, status: Status,
                  exit_code: int, outcome: History, lease: Lease,
                  new_state: str | None = None, output: bytes | None = None) -> bool | None:
    """Write the result, retrying on fresh connections until the lease's deadline plus
    finish_grace (a statement that gets no answer is left behind on its connection).
    output, the tail of the command's output, goes into the same write.

    True: recorded (now, or by an earlier try whose answer was lost). False: the row is no
    longer ours. None: the ledger stayed unreachable, or refused the statement.
    """
    stored = text(output) if output is not None else None
    give_up = lease.deadline + finish_grace(job.stale_after)
    while True:
        try:
            # Waits for a renewal in flight, and gives up on a server that stopped answering.
            return lease.call(lambda: ledger.finish(
                job.name, key, claim.attempt, status, exit_code, outcome,
                new_state if status == "done" else None, claim.state_version, stored),
                until=give_up)
        except NoAnswer as exc:
            lease.last_error = str(exc)
            ledger.abandon()  # the statement still waits on the connection: never close it
        except LedgerError as exc:
            lease.last_error = str(exc)
            ledger.close()
            if not exc.transient:  # a refused statement stays refused
                return None
        left = give_up - lease.now()
        if left <= 0:
            return None
        time.sleep(min(1.0, left))
