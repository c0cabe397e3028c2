"""Catch-up's progress bar on a terminal (rich); plain lines elsewhere come from core."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from once.core import Progress as PlainProgress
from once.core import Result
from once.escape import shown
from once.periods import Period


class BarProgress(PlainProgress):
    """done/total, the current period, elapsed time and failures, on stderr."""

    def __init__(self) -> None:
        self.failures = 0
        self.bar = Progress(
            TextColumn("catch-up"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[current]}", markup=False),
            TextColumn("[red]{task.fields[failed]}"),
            TimeElapsedColumn(), console=Console(stderr=True), transient=False,
        )
        self.task: TaskID | None = None

    def start(self, total: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task("catch-up", total=total, current="", failed="")

    def period(self, period: Period) -> None:
        assert self.task is not None
        self.bar.update(self.task, current=period.key)

    def result(self, period: Period, result: Result, seconds: float) -> None:
        assert self.task is not None
        if not result.ok:
            self.failures += 1
            self.bar.console.print(Text(f"once: {shown(period.key)}: {result.outcome} "
                                        f"(exit {result.status})"))
        failed = f"{self.failures} failed" if self.failures else ""
        self.bar.update(self.task, advance=1, failed=failed)

    def stop(self) -> None:
        self.bar.stop()
