"""The words for how an attempt and a period ended, and the one way each leads to the next.

    wrapper kind ──> ledger status (once_runs.status)
         │     └──> history outcome (once_attempts.outcome: more than the status says)
         └────────> result (what `once run` tells: ONCE_OUTCOME, hooks, pings, its logs)

Each vocabulary is a Literal, so that a misspelt word is a type error, and every mapping
between them is a function here (docs/how-to/pings-and-hooks.md and docs/reference/commands.md
"once history" show the words a user sees). On the hot path of every cron fire: imports
nothing of once.
"""

from __future__ import annotations

from typing import Literal

# How the command ended (once.run.wrapper.Outcome.kind): its exit or signal, or what once did.
Kind = Literal["exited", "signaled", "exec-failed", "timed-out", "fenced-out", "guard-died"]

# What a finished row of once_runs holds (it holds `running` while an owner has it).
Status = Literal["done", "failed"]

# What the history keeps of a finished attempt: its status, or why it failed.
History = Literal["done", "failed", "timed-out", "exec-failed", "guard-died", "interrupted",
                  "bad-state"]

# A claim that was not won, by the row's status as the claim found it.
Skip = Literal["skipped-done", "skipped-held", "skipped-failed", "skipped-overlap"]

# What became of a period for `once run`, its hooks and pings (ONCE_OUTCOME).
Result = Literal["done", "failed", "timed-out", "fenced-out", "skipped-done", "skipped-held",
                 "skipped-failed", "skipped-overlap", "unreachable", "command-drift"]

SKIPS: tuple[Skip, ...] = ("skipped-done", "skipped-held", "skipped-failed", "skipped-overlap")

# Results that count as a success: catch-up goes on, the run is ok.
OK: frozenset[Result] = frozenset(("done", *SKIPS))

# Results where nothing was claimed: no ping or hook (the missing success ping is the alarm,
# a refused command drift is a usage error), and a catch-up stops there.
UNCLAIMED: frozenset[Result] = frozenset(("unreachable", "command-drift"))


def skip(row_status: str) -> Skip:
    """Why a claim was not won, from the status of the row it found: `skipped-held` for a
    running row (a live owner has it)."""
    if row_status == "done":
        return "skipped-done"
    if row_status == "overlap":
        return "skipped-overlap"
    return "skipped-failed" if row_status == "failed" else "skipped-held"


def status(succeeded: bool, bad_state: bool) -> Status:
    """The row's status: done when the command succeeded and left a watermark that can be
    stored (or none)."""
    return "done" if succeeded and not bad_state else "failed"


_HISTORY_OF_KIND: dict[Kind, History] = {"timed-out": "timed-out", "exec-failed": "exec-failed",
                                         "guard-died": "guard-died"}


def history(kind: Kind, succeeded: bool, interrupted: bool, bad_state: bool) -> History:
    """The history's outcome of a recorded attempt: the status, or more where there is more
    to say (a bad watermark, then a forwarded signal, then how once ended it)."""
    if bad_state:
        return "bad-state"
    if interrupted:
        return "interrupted"
    return _HISTORY_OF_KIND.get(kind) or status(succeeded, bad_state)


def result(kind: Kind, recorded: Status) -> Result:
    """The result of a recorded attempt: timed-out (exit 124) else the row's status."""
    return "timed-out" if kind == "timed-out" else recorded


# A period gets at most ATTEMPTS_IN_ALL times --max-attempts attempts, whatever ends them
# (a failure, a takeover of a row whose owner died or could not record its result, an
# interruption): a running row gone stale at that many is recorded failed by the claim that
# finds it, never taken over again, and a failed one is not retried (only `once rerun` takes
# it). Without it, a result that can never be recorded would be run again on every fire, and
# a period interrupted on every attempt retried, for ever.
ATTEMPTS_IN_ALL = 3


def attempts_left(attempt: int, interrupted: int, max_attempts: int) -> int:
    """How many more attempts a failed row gets (docs/concepts/liveness.md): --max-attempts counts
    its attempts that were not interrupted (a forwarded SIGTERM, SIGINT or SIGHUP), and no
    period gets more than ATTEMPTS_IN_ALL x --max-attempts attempts of any cause. The claim's
    takeover rule in SQL (once.ledger's dialects) is this one: `attempt - interrupted <
    max_attempts AND attempt < attempt_cap`."""
    return max(0, min(max_attempts - (attempt - interrupted),
                      ATTEMPTS_IN_ALL * max_attempts - attempt))
