"""Catch-up's progress on a terminal (rich); the plain lines of a pipe are once.run.backfill's.

The command runs in the terminal and writes to it directly (docs/concepts/output.md: on a terminal
nothing of it is relayed), so a bar redrawn in place while it runs would be drawn into the
command's own lines. The bar is therefore drawn between the periods, never while a command
runs, and never redrawn: before each period one line on stderr, `once: JOB PERIOD  ━━━╸━━
9/31  7s, ETA 22s`, and below it whatever the command writes. A period that did not end done
gets a line of its own (red when it failed); the end, a summary line as in a pipe.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from once.escape import shown
from once.periods import Period
from once.run.backfill import Progress, span
from once.run.flow import Result
from once.secrets import scrub

if TYPE_CHECKING:
    from rich.console import RenderableType


class BarProgress(Progress):
    """The bar between the periods, on stderr (see the module's docstring)."""

    def __init__(self) -> None:
        from rich.console import Console

        super().__init__()
        self.console = Console(stderr=True, highlight=False)

    def period(self, period: Period) -> None:
        self.console.print(self.bar(period))

    def bar(self, period: Period) -> RenderableType:
        """This period's line: what starts, the bar of what is done, the count, the time."""
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        label = Text(scrub(shown(f"once: {self.job} {period.key}")), style="bold")
        count = f"{self.tried + 1}/{self.total}"
        eta = self.eta()
        when = (f"{span(time.monotonic() - self.began)}, ETA {span(eta)}" if eta is not None
                else "")
        room = self.console.width - label.cell_len - len(count) - len(when) - 3
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, overflow="ellipsis")
        grid.add_column(width=max(10, min(30, room)))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, style="dim")
        grid.add_row(label, ProgressBar(total=self.total, completed=self.tried,
                                        width=max(10, min(30, room))), count, when)
        return grid

    def result(self, period: Period, result: Result, seconds: float) -> None:
        from rich.text import Text

        self.count(result, seconds, period)
        if result.outcome == "done":
            return  # the next period's bar counts it
        style = "dim" if result.ok else "bold red"
        self.console.print(Text(scrub(shown(f"once: {self.line(period, result, seconds)}")),
                                style=style))

    def stop(self) -> None:
        from rich.text import Text

        if not self.total:
            return
        text = self.summary()
        style = "bold green" if text.startswith("caught up") else "bold red"
        self.console.print(Text(scrub(shown(f"once: {text}")), style=style))
