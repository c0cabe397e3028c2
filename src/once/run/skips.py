"""What a claim that was not won says (`once:` lines), by why it skipped: on the hot path of
every cron fire that skips, so the standard library and once's leaves alone, and no SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from once.ledger.records import capped_line, used_up_line
from once.messages import ERROR, VERBOSE, Voice
from once.messages import say as tell

if TYPE_CHECKING:
    from once.ledger import Claim, Job


def say(what: str, claim: Claim, job: Job, voice: Voice, rerun: bool = False) -> None:
    """The line of a skip (most only with -v), or of a rerun refused (always)."""
    skip = claim.skip_reason
    if rerun and skip in ("skipped-held", "skipped-overlap"):
        refused(what, claim, voice)
    elif claim.capped:  # once, by the claim that did it: said even with -q
        tell(f"{what}: {capped_line(claim.attempt, job.max_attempts)}", voice, ERROR, "capped")
    elif skip == "skipped-failed":
        tell(f"{what}: skipped: "
             f"{used_up_line(claim.attempt, claim.interrupted, job.max_attempts)} (once rerun "
             f"runs it again)", voice, event=skip)
    elif skip == "skipped-done":
        tell(f"{what}: skipped: done by attempt {claim.attempt}", voice, VERBOSE, skip)
    elif skip == "skipped-overlap":
        tell(f"{what}: skipped: --no-overlap and {claim.held_period} is still held by "
             f"{claim.owner} (attempt {claim.attempt}); nothing was claimed, a later catch-up "
             f"makes it up", voice, event=skip)
    else:
        tell(f"{what}: skipped: held by {claim.owner} ({liveness(claim)})", voice, VERBOSE,
             skip)


def liveness(claim: Claim) -> str:
    """attempt 2, heartbeat 1.2s ago, stale after 30s: what a held claim said of its holder."""
    age = f", heartbeat {claim.heartbeat_age:.1f}s ago" if claim.heartbeat_age else ""
    promise = f", stale after {claim.stale_after:g}s" if claim.stale_after is not None else ""
    return f"attempt {claim.attempt}{age}{promise}"


def refused(what: str, claim: Claim, voice: Voice) -> None:
    """A rerun's claim that a live attempt held back: the period's own, or with --no-overlap
    another period's. Nothing is made up later (no catch-up reruns a done period): said
    even with -q, with status 69 (once.run.flow.rerun_period)."""
    if claim.skip_reason == "skipped-overlap":
        holds = (f"--no-overlap and {claim.held_period} is still held by {claim.owner} "
                 f"({liveness(claim)})")
    else:
        holds = f"a live attempt holds it ({claim.owner}, {liveness(claim)})"
    tell(f"{what}: rerun refused: {holds}; nothing was run, try again when it has finished",
         voice, ERROR, "rerun-refused")
