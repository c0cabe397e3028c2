"""What the command is handed: its environment (docs/reference/run.md "The command's
environment") and the file it may leave the job's new watermark in (--state). On the hot path:
standard library, once.limits and once.periods only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from once.limits import STATE_LIMIT, state_problem
from once.periods import Period, iso

if TYPE_CHECKING:
    from once.ledger import Claim, Job

# Every name `once` gives the command or a hook (docs/reference/run.md "The command's
# environment"). None is a variable `once` reads (ONCE_TZ, read as --tz, is given as
# ONCE_PERIOD_TZ), and each is dropped from what the command inherits before this run's own
# are set: a `once` that the command or a hook starts behaves as it does when cron starts it,
# and never sees an outer run's shard, watermark file or attempt as its own.
EXPORTED = ("ONCE_JOB", "ONCE_PERIOD", "ONCE_PERIOD_START", "ONCE_PERIOD_END",
            "ONCE_PERIOD_TZ", "ONCE_ATTEMPT", "ONCE_FENCE", "ONCE_STATE", "ONCE_STATE_OUT",
            "ONCE_SHARD", "ONCE_SHARDS", "ONCE_OUTCOME", "ONCE_STATUS", "ONCE_OUTPUT_FILE")
# `once lead`'s (once.run.lead.child_env): no `once` reads them, so a `once run` that a leader's
# command starts passes them on to its own command, which fences its writes by the term.
LEAD_EXPORTED = ("ONCE_LEAD", "ONCE_TERM")


def child_env(job: Job, period: Period, claim: Claim | None, shard: int | None = None,
              claimed: bool = True) -> dict[str, str]:
    """The command's environment (docs/reference/run.md "The command's environment"); a skip's
    hooks get it without the attempt."""
    env = {name: value for name, value in os.environ.items() if name not in EXPORTED}
    env.update({
        "ONCE_JOB": job.name,
        "ONCE_PERIOD": period.key,
        "ONCE_PERIOD_START": iso(period.start),
        "ONCE_PERIOD_END": iso(period.end),
        "ONCE_PERIOD_TZ": job.tz,
    })
    if claimed and claim is not None:
        env.update({"ONCE_ATTEMPT": str(claim.attempt), "ONCE_FENCE": str(claim.fence)})
    if shard is not None:
        env.update({"ONCE_SHARD": str(shard), "ONCE_SHARDS": str(job.shards)})
    return env


class StateFile:
    """ONCE_STATE_OUT: a path in a private directory where the command may leave a new
    watermark. No file means no change; one trailing newline is dropped; at most 64 KiB of
    UTF-8, else the run fails."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted  # without --state: no directory, and read() finds nothing
        self.directory = ""
        self.path = ""

    def __enter__(self) -> StateFile:
        if self.wanted:
            import tempfile

            self.directory = tempfile.mkdtemp(prefix="once-state-")
            self.path = os.path.join(self.directory, "state")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.directory:
            import shutil

            shutil.rmtree(self.directory, ignore_errors=True)

    def read(self) -> tuple[str | None, str]:
        """(the new watermark or None for no change, an error message or '')."""
        if not self.wanted:
            return None, ""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(STATE_LIMIT + 2)
        except FileNotFoundError:
            return None, ""
        except OSError as exc:
            return None, f"cannot read ONCE_STATE_OUT: {exc.strerror}"
        if data.endswith(b"\n"):
            data = data[:-1]
        problem = state_problem(data)
        if problem:
            return None, f"the new state written to ONCE_STATE_OUT {problem}"
        return data.decode("utf-8"), ""
