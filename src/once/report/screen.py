"""The reports' tables on a terminal, fitted to its width (rich is imported only here, and
only when a table is drawn on one).

`once status`: every column with its whole text (as the pipe's plain table has them) when
that fits; else the compact cells (once.report.render.status_cells(compact=True): short
period keys, NOW without its key) and, while the table is still wider than the terminal,
columns dropped by priority (DROP_ORDER), the caption saying which. JOB is never wrapped
(a name split across lines is unreadable and unsearchable); the other cells wrap at spaces
only, and a word that cannot fit is cut short with an ellipsis, never folded in two.
--wide draws every column whatever the width.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from once.escape import shown
from once.report.model import JobState
from once.report.render import STATUS_HEADERS, Cell, Fitted, status_cells
from once.secrets import scrub

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# The status columns a narrow terminal loses, first to last ("RUNNING?": only while no job
# runs anything). JOB, FAILED, MISSING, NOW and NEXT are always shown.
DROP_ORDER = ("TOOK", "TZ", "SCHEDULE", "FINISHED", "RUNNING?", "LAST DONE", "RUNNING")
CUT_ROOM = 24  # what a cut column (history's LAST LINE) is given, at least, when others fit


def status_table(states: Sequence[JobState], now: datetime, caption: str,
                 wide: bool = False, more: Sequence[Fitted] = ()) -> None:
    """`once status` on a terminal: as wide as it fits (see the module's docstring), the
    `more` tables (the lead names') under it (none without jobs); the caption under them,
    wrapped to the terminal."""
    from rich.console import Console
    from rich.text import Text

    hidden = print_fitted(STATUS_HEADERS, [status_cells(s, now) for s in states],
                          [status_cells(s, now, compact=True) for s in states], DROP_ORDER,
                          job_column=0, wide=wide) if states else []
    console = Console(highlight=False)
    for table in more:
        if states or table is not more[0]:
            console.print()
        hidden += [h for h in print_fitted(table.headers, table.rows, table.compact,
                                           table.drop, job_column=0, wide=wide)
                   if h not in hidden]
    console.print(Text(scrub(shown(caption)), overflow="fold"))
    if hidden:
        console.print(Text(f"hidden at this width: {', '.join(hidden)} (--wide shows them)"))


def print_fitted(headers: Sequence[str], rows: Sequence[Sequence[Cell]],
                 compact: Sequence[Sequence[Cell]], drop: Sequence[str], title: str = "",
                 job_column: int | None = None, cut: int | None = None,
                 wide: bool = False) -> list[str]:
    """Print the table as it fits the terminal: rows whole, else the compact rows (their
    headers without a parenthesis) with as few columns dropped (in the order of `drop`; a
    name ending in ? only while its every cell is -) as it takes; wide: rows whole however
    wide. The headers of the columns dropped."""
    from rich.console import Console

    console = Console(highlight=False)
    every = list(range(len(headers)))
    natural = _width(console, headers, rows, every, job_column, cut)
    if natural <= console.width or wide:
        if natural > console.width:  # --wide: lines as long as they are; the terminal wraps
            console = Console(highlight=False, width=natural)
        console.print(_table(console, headers, rows, every, title, job_column, cut))
        return []
    short = [h.split(" (")[0] for h in headers]
    kept, hidden = list(every), []
    for name in drop:
        if _width(console, short, compact, kept, job_column, cut) <= console.width:
            break
        index = short.index(name.rstrip("?"))
        if name.endswith("?") and any(row[index][0] != "-" for row in compact):
            continue
        if index in kept:
            kept.remove(index)
            hidden.append(index)
    for index in reversed(list(hidden)):  # a column dropped early may fit again now
        trial = sorted([*kept, index])
        if _width(console, short, compact, trial, job_column, cut) <= console.width:
            kept = trial
            hidden.remove(index)
    job_width = None
    if job_column is not None and _width(console, short, compact, kept, job_column,
                                         cut) > console.width:
        # Still too wide: a name longer than the room the others leave is cut short (…).
        others = [i for i in kept if i != job_column]
        job_width = max(10, console.width - 2 - _width(console, short, compact, others, None,
                                                       cut))
    console.print(_table(console, short, compact, kept, title, job_column, cut, job_width))
    return [short[i] for i in sorted(hidden)]


def _width(console: Console, headers: Sequence[str], rows: Sequence[Sequence[Cell]],
           kept: list[int], job_column: int | None, cut: int | None) -> int:
    """The kept columns' width with nothing wrapped; a cut column counts for what it needs up
    to CUT_ROOM (it takes what the others leave)."""
    others = [i for i in kept if i != cut]
    width = _natural(console, build([headers[i] for i in others],
                                    [[row[i] for i in others] for row in rows],
                                    job_column=_moved(job_column, others)))
    if cut is not None and cut in kept:
        need = max([len(headers[cut]), *(len(scrub(shown(row[cut][0]))) for row in rows)])
        width += 2 + min(need, CUT_ROOM)
    return width


def _table(console: Console, headers: Sequence[str], rows: Sequence[Sequence[Cell]],
           kept: list[int], title: str, job_column: int | None, cut: int | None,
           job_width: int | None = None) -> Table:
    return build([headers[i] for i in kept], [[row[i] for i in kept] for row in rows],
                 title=title, job_column=_moved(job_column, kept), cut=_moved(cut, kept),
                 console=console, job_width=job_width)


def _moved(column: int | None, kept: list[int]) -> int | None:
    """Where a column is among the kept ones (None: not kept, or none)."""
    return kept.index(column) if column is not None and column in kept else None


def _natural(console: Console, table: Table) -> int:
    """The table's width with nothing wrapped (console.measure stops at the console's)."""
    return console.measure(table, options=console.options.update_width(1 << 20)).maximum


def build(headers: Sequence[str], rows: Sequence[Sequence[Cell]], caption: str = "",
          title: str = "", job_column: int | None = None, cut: int | None = None,
          console: Console | None = None, job_width: int | None = None) -> Table:
    """A rich table of these cells: two spaces between columns, a rule under the header.
    The job_column is never wrapped (past job_width it is cut short); the column numbered
    `cut` is one line a row, cut short (…) to what the terminal's width leaves it; the others
    wrap at spaces, and a word too long for its column is cut short, never folded."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    cells = [[scrub(shown(text)) for text, _ in row] for row in rows]  # once.secrets
    # Text objects, never strings: rich would read a job named `x[/]y` or `[link=…]` as markup.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  title=Text(scrub(shown(title))) if title else None,
                  caption=Text(scrub(shown(caption))) if caption else None,
                  header_style="bold", title_justify="left", caption_justify="left")
    for number, header in enumerate(headers):
        if number == cut and console is not None:
            others = sum(max([len(header_), *(len(row[i]) for row in cells)]) + 2
                         for i, header_ in enumerate(headers) if i != cut)
            table.add_column(Text(header), overflow="ellipsis", no_wrap=True,
                             max_width=max(len(header), console.width - others))
        elif number == job_column:
            table.add_column(Text(header), overflow="ellipsis", no_wrap=True,
                             max_width=job_width)
        else:
            table.add_column(Text(header), overflow="ellipsis")
    for row, texts in zip(rows, cells, strict=True):
        table.add_row(*[Text(text, style=style)
                        for text, (_, style) in zip(texts, row, strict=True)])
    return table
