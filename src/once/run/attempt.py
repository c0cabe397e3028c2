"""What the owner of a claimed attempt writes to the ledger once its command has ended: the
fenced final write (retried past the lease's deadline) and a fenced-out attempt's output; and
the renewal its lease calls. Shared by `once run` (once.run.flow) and the Python API (once.api).
No SQL here: it asks the ledger by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from once.ledger import Claim, Job, Ledger, LedgerError
from once.ledger.records import attempt_cap
from once.limits import OUTPUT_TAIL
from once.outcomes import History, Status, attempts_left
from once.run.lease import Lease, NoAnswer
from once.run.relay import text


def renewal(ledger: Ledger, job: str, key: str, claim: Claim,
            finished: Callable[[], bool] = lambda: False) -> Callable[[], bool]:
    """The lease's renewal of our attempt: True while the row is ours (and once finished()
    says nothing is left to keep alive). A failed renewal closes the connection, so that
    the next opens a fresh one."""
    def renew() -> bool:
        if finished():
            return True
        try:
            return ledger.renew(job, key, claim)
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
        lease.call(lambda: ledger.keep_output(job.name, key, claim, text(output)),
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


# A tail the ledger refused (too large, not in the column's charset: `unfit`; too slow to
# write: `slow`) is cut for the next try: to the default --output-tail, then to nothing but
# the line that says so (records.cut_tail). The result is what must be recorded; the tail is
# the part that can give way. With nothing left to cut, `unfit` is refused for good, `slow`
# retried until the bound.
OUTPUT_CUTS = (OUTPUT_TAIL, 0)


def record_result(ledger: Ledger, job: Job, key: str, claim: Claim, status: Status,
                  exit_code: int, outcome: History, lease: Lease,
                  new_state: str | None = None, output: bytes | None = None) -> bool | None:
    """Write the result, retrying on fresh connections until the lease's deadline plus
    finish_grace (a statement that gets no answer is left behind on its connection).
    output, the tail of the command's output, goes into the same write, cut to what the
    ledger takes (OUTPUT_CUTS).

    True: recorded (now, or by an earlier try whose answer was lost). False: the row is no
    longer ours. None: the ledger stayed unreachable or failing until the bound, or refused
    the statement with an error no retry cures, at once (lease.failure says which,
    lease.last_error in its words: trouble()).
    """
    stored = text(output) if output is not None else None
    return _retried(ledger, job, lease, partial(
        ledger.finish, job.name, key, claim, status, exit_code, outcome,
        new_state if status == "done" else None, claim.state_version, stored),
        cut=bool(stored))


def record_marked(ledger: Ledger, job: Job, key: str, claim: Claim,
                  lease: Lease) -> bool | None:
    """After the Python API's Run.finish_in: record done once its marker has committed,
    retried as record_result is. True: recorded; False: no committed marker (nothing
    written); None: the ledger stayed unreachable, or refused the statement."""
    return _retried(ledger, job, lease,
                    lambda _limit: ledger.finish_marked(job.name, key, claim))


def _retried(ledger: Ledger, job: Job, lease: Lease,
             write: Callable[[tuple[int, str] | None], bool], cut: bool = False) -> bool | None:
    """A final write, tried on fresh connections until the lease's deadline plus
    finish_grace (a statement that gets no answer is left behind on its connection).
    cut: the write carries a tail, which write(limit) cuts to `limit` (OUTPUT_CUTS)."""
    give_up = lease.deadline + finish_grace(job.stale_after)
    limit: tuple[int, str] | None = None
    cuts = iter(OUTPUT_CUTS if cut else ())
    while True:
        try:
            # Waits for a renewal in flight, and gives up on a server that stopped answering.
            return lease.call(partial(write, limit), until=give_up)
        except NoAnswer as exc:
            lease.last_error, lease.failure = str(exc), "no-answer"
            ledger.abandon()  # the statement still waits on the connection: never close it
        except LedgerError as exc:
            lease.failed(exc)
            lease.write_waited_on = lease.waited_on or lease.write_waited_on
            ledger.close()
            size = next(cuts, None) if exc.failure in ("unfit", "slow") else None
            if size is not None:  # at once: the next try is smaller
                limit = (size, f"the ledger refused it whole ({exc.cause[:200]})")
                continue
            if exc.failure in ("permanent", "unfit"):  # refused, and nothing left to cut
                lease.failure = "permanent"
                return None
        left = give_up - lease.now()
        if left <= 0:
            return None
        time.sleep(min(1.0, left))


def lost_reason(ledger: Ledger, job: str, key: str, claim: Claim) -> str:
    """Why the row is no longer ours, as the ledger shows it now (read on this path only): a
    takeover, or a claim the ledger lost (a failover to a standby that lacked its commit),
    which another claim may have replaced with the same attempt number."""
    try:
        row = ledger.holder(job, key)
    except LedgerError:
        return "another attempt took it over"
    if row is None:
        return ("the ledger no longer holds this claim (lost in a failover to a standby "
                "that lacked it?)")
    attempt, fence, owner, claim_id, _ = row
    if attempt > claim.attempt or claim_id == claim.claim_id:
        return f"another attempt took it over (attempt {attempt}, owner {owner})"
    return (f"the ledger holds another claim of attempt {attempt} (owner {owner}, fence "
            f"{fence}), not this one: this claim was lost (in a failover to a standby that "
            f"lacked it?)")


def trouble(lease: Lease, what: str) -> str:
    """What kept the ledger from taking `what` (the lease's writes), as a `once:` line says it
    (lease.failure): unreachable only when it was (or gave no answer); a lock another
    session held, by name."""
    if lease.failure == "locked":
        return f"{what} waited on {lease.waited_on} held by another session"
    if lease.failure == "no-answer" and lease.write_waited_on:  # its last try, left waiting
        return f"{what} waited on {lease.write_waited_on} held by another session"
    if lease.failure in ("unreachable", "no-answer", ""):
        return "the ledger stayed unreachable"
    if lease.failure == "permanent":
        return f"the ledger refused {what}"
    return f"the ledger kept failing {what}"  # busy, locked, too slow: until the bound


def unrecorded(lease: Lease, status: Status, attempt: int, max_attempts: int) -> tuple[str, str]:
    """The words (and the log event) of a result the ledger did not take."""
    why = trouble(lease, "the write")
    said = f"was not recorded ({lease.last_error}); the period will be retried"
    if lease.failure == "no-answer":  # on its way, or waiting on a lock: it may land yet
        said = (f"was not recorded as far as once knows ({lease.last_error}: the write may "
                f"still land, left waiting on the server); unless it lands, the period will "
                f"be retried")
    return (f"{why}, the result ({status}) {said} once its claim goes stale (attempt {attempt} "
            f"of at most {attempt_cap(max_attempts)})",
            "unreachable" if why.endswith("unreachable") else "not-recorded")



def next_step(ledger: Ledger, job: Job, key: str, claim: Claim) -> str:
    """A failed attempt's place among its period's attempts and what comes next, for its
    `once:` line (cron mails it): `attempt 2 of 3; the next fire retries it`. The row's
    interrupted attempts are read (on this path only): they do not count against
    --max-attempts."""
    try:
        row = ledger.holder(job.name, key)
    except LedgerError:
        row = None
    interrupted = row[4] if row is not None and row[0] == claim.attempt else 0
    counted = claim.attempt - interrupted
    place = (f"attempt {claim.attempt} of {job.max_attempts}" if not interrupted else
             f"attempt {claim.attempt} ({counted} of --max-attempts {job.max_attempts} "
             f"counted)")
    if attempts_left(claim.attempt, interrupted, job.max_attempts):
        return f"{place}; the next fire retries it"
    return (f"{place}; no attempts left: `once rerun --job {job.name} --period {key}` runs "
            f"it again")
