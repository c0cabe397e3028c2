"""The reports on a terminal, fitted to its width (rich is imported only here, and only
when a table is drawn on one).

`once status` and `once history`: every column with its whole text (as the pipe's plain
table has them) when that fits; else the compact cells (once.report.render.status_cells(
compact=True): short period keys, NOW without its key) and, while the table is still wider
than the terminal, columns dropped by priority (DROP_ORDER, HISTORY_DROP), a line under the
table saying which and that --wide shows them. A history's header keeps its parenthesis (the
zone its short times are still in: `STARTED (Europe/Berlin)`; a lead's SINCE, an age when
short, loses it). JOB is never wrapped (a name split across lines is
unreadable and unsearchable); history's LAST LINE is one line cut to what the others leave
(the line under the table says so, and how to read it whole); the other cells wrap at
spaces only, and a word that cannot fit is cut short with an ellipsis, never folded in two.
--wide draws every column whatever the width.

`once check`: a finding that fits is its one line, as a pipe gets it; one wider than the
terminal keeps its head (severity, job, period, problem) on its first line and its details
on indented lines under it, broken between phrases: the terminal never wraps a finding
mid-phrase, and every line that starts at the margin is a finding's.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from once.escape import shown
from once.secrets import scrub

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# The status columns a narrow terminal loses, first to last ("RUNNING?": only while no job
# runs anything). JOB, FAILED, MISSING, NOW and NEXT are always shown.
DROP_ORDER = ("TOOK", "TZ", "SCHEDULE", "FINISHED", "RUNNING?", "LAST DONE", "RUNNING")
CUT_ROOM = 24  # what a cut column (history's LAST LINE) is given, at least, when others fit

Cell = tuple[str, str]  # (text, rich style; "" for none): a pipe's plain table has them too


class Fitted(NamedTuple):
    """A table drawn under the jobs' (the lead names', once.report.leads): its headers, its
    rows whole and compact, and the columns a narrow terminal loses first."""

    headers: Sequence[str]
    rows: Sequence[Sequence[Cell]]
    compact: Sequence[Sequence[Cell]]
    drop: Sequence[str]


class Fit(NamedTuple):
    """How a table was drawn: the headers of the columns left out, and whether the cut
    column (history's LAST LINE) was cut short in any row."""

    hidden: list[str]
    cut: bool = False


def hidden_line(hidden: Sequence[str]) -> str:
    return f"hidden at this width: {', '.join(hidden)} (--wide shows them)"


def status_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]],
                 compact: Sequence[Sequence[Cell]], caption: str, wide: bool = False,
                 more: Sequence[Fitted] = ()) -> None:
    """`once status` on a terminal: the jobs' table (its rows whole and compact, a row a job;
    once.report.render's cells) as wide as it fits (see the module's docstring), the `more`
    tables (the lead names') under it (none without jobs); the caption under them, wrapped
    to the terminal."""
    from rich.console import Console
    from rich.text import Text

    hidden = print_fitted(headers, rows, compact, DROP_ORDER, job_column=0,
                          wide=wide).hidden if rows else []
    console = Console(highlight=False)
    for table in more:
        if rows or table is not more[0]:
            console.print()
        hidden += [h for h in print_fitted(table.headers, table.rows, table.compact,
                                           table.drop, job_column=0, wide=wide).hidden
                   if h not in hidden]
    console.print(Text(scrub(shown(caption)), overflow="fold"))
    if hidden:
        console.print(Text(hidden_line(hidden)))


def history_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]],
                  compact: Sequence[Sequence[Cell]], drop: Sequence[str], logs: str | None,
                  title: str = "", job_column: int | None = None, wide: bool = False) -> None:
    """`once history` on a terminal: fitted as status is, its last column (LAST LINE; none
    without `logs`) one line cut to the room left, then what the fitting left out and how to
    see it: --wide for the columns and the lines whole (as a pipe has them), `logs` (a `once
    logs` command line) for all an attempt said."""
    from rich.console import Console
    from rich.text import Text

    cut = None if wide or logs is None else len(headers) - 1
    fit = print_fitted(headers, rows, compact, drop, title=title, job_column=job_column,
                       cut=cut, wide=wide, zoned=True)
    console = Console(highlight=False)
    notes = [hidden_line(fit.hidden)] if fit.hidden else []
    if fit.cut and logs:  # the command on a line of its own unless the whole note fits one
        note = "LAST LINE cut at this width: --wide shows it whole; all an attempt said:"
        notes += [f"{note} {logs}"] if len(note) + 1 + len(logs) <= console.width else [
            note, f"  {logs}"]
    for note in notes:
        console.print(Text(scrub(shown(note))))


def print_fitted(headers: Sequence[str], rows: Sequence[Sequence[Cell]],
                 compact: Sequence[Sequence[Cell]], drop: Sequence[str], title: str = "",
                 job_column: int | None = None, cut: int | None = None,
                 wide: bool = False, zoned: bool = False) -> Fit:
    """Print the table as it fits the terminal: rows whole, else the compact rows (their
    headers without a parenthesis, unless zoned: the compact cells are still in the zone it
    names) with as few columns dropped (in the order of `drop`, a header named without its
    parenthesis; a name ending in ? only while its every cell is - or empty) as it takes;
    wide: rows whole however wide. The headers of the columns dropped (without their
    parenthesis), and whether the cut column was cut short."""
    from rich.console import Console

    console = Console(highlight=False)
    every = list(range(len(headers)))
    natural = _width(console, headers, rows, every, job_column, cut)
    if natural <= console.width or wide:
        if natural > console.width:  # --wide: lines as long as they are; the terminal wraps
            console = Console(highlight=False, width=natural)
        console.print(_table(console, headers, rows, every, title, job_column, cut))
        return Fit([], _was_cut(console, headers, rows, every, cut))
    short = [h.split(" (")[0] for h in headers]  # the names `drop` and the notes use
    headers = headers if zoned else short
    kept, hidden = list(every), []
    for name in drop:
        if _width(console, headers, compact, kept, job_column, cut) <= console.width:
            break
        index = short.index(name.rstrip("?"))
        if name.endswith("?") and any(row[index][0] not in ("-", "") for row in compact):
            continue
        if index in kept:
            kept.remove(index)
            hidden.append(index)
    for index in reversed(list(hidden)):  # a column dropped early may fit again now
        trial = sorted([*kept, index])
        if _width(console, headers, compact, trial, job_column, cut) <= console.width:
            kept = trial
            hidden.remove(index)
    job_width = None
    if job_column is not None and _width(console, headers, compact, kept, job_column,
                                         cut) > console.width:
        # Still too wide: a name longer than the room the others leave is cut short (…).
        others = [i for i in kept if i != job_column]
        job_width = max(10, console.width - 2 - _width(console, headers, compact, others,
                                                       None, cut))
    console.print(_table(console, headers, compact, kept, title, job_column, cut, job_width))
    return Fit([short[i] for i in sorted(hidden)],
               _was_cut(console, headers, compact, kept, cut))


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


def _was_cut(console: Console, headers: Sequence[str], rows: Sequence[Sequence[Cell]],
             kept: list[int], cut: int | None) -> bool:
    """Whether build() cut some row's cell of the cut column short (to the room it left)."""
    if cut is None or cut not in kept:
        return False
    cells = [[scrub(shown(row[i][0])) for i in kept] for row in rows]
    return any(len(row[kept.index(cut)]) > _cut_room(console, [headers[i] for i in kept],
                                                      cells, kept.index(cut)) for row in cells)


def _cut_room(console: Console, headers: Sequence[str], cells: Sequence[Sequence[str]],
              cut: int) -> int:
    """The width build() gives the cut column: what the others leave of the terminal."""
    others = sum(max([len(header), *(len(row[i]) for row in cells)]) + 2
                 for i, header in enumerate(headers) if i != cut)
    return max(len(headers[cut]), console.width - others)


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
            table.add_column(Text(header), overflow="ellipsis", no_wrap=True,
                             max_width=_cut_room(console, headers, cells, cut))
        elif number == job_column:
            table.add_column(Text(header), overflow="ellipsis", no_wrap=True,
                             max_width=job_width)
        else:
            table.add_column(Text(header), overflow="ellipsis")
    for row, texts in zip(rows, cells, strict=True):
        table.add_row(*[Text(text, style=style)
                        for text, (_, style) in zip(texts, row, strict=True)])
    return table


# -- once check ------------------------------------------------------------------------------

INDENT = "    "  # a finding's details under its head
_PHRASE_END = re.compile(r"(?<=[,;:?]) ")  # where a finding's details may break


def finding_lines(lines: Sequence[str], width: int | None = None) -> list[str]:
    """check's lines (a finding's `SEVERITY JOB PERIOD PROBLEM (DETAILS)`, or the OK line)
    fitted to the terminal (see the module's docstring); scrubbed of the ledger's secrets
    before they are broken."""
    width = max(40, width or shutil.get_terminal_size().columns)
    out: list[str] = []
    for line in lines:
        line = scrub(line)
        if len(line) <= width:
            out.append(line)
            continue
        # The first three fields never hold a space (once.escape.shown_word), so the first
        # " (" opens the details.
        head, paren, details = line.partition(" (")
        out += _filled(_PHRASE_END.split(head), width)
        if paren:
            out += _filled(_PHRASE_END.split("(" + details), width, first=INDENT)
    return out


def _filled(phrases: Sequence[str], width: int, first: str = "") -> list[str]:
    """The phrases on as few lines as they fit, each line after the first indented (the
    first too, by `first`); a phrase that does not fit the line begins the next, and one
    wider than a line breaks at its spaces, a word wider than a line where it must."""
    lines = [first]
    for phrase in phrases:
        if lines[-1].strip() and len(lines[-1]) + 1 + len(phrase) > width:
            lines.append(INDENT)
        for piece in _pieces(phrase, width - len(INDENT)):
            if lines[-1].strip() and len(lines[-1]) + 1 + len(piece) > width:
                lines.append(INDENT)
            lines[-1] += (" " if lines[-1].strip() else "") + piece
    return lines


def _pieces(phrase: str, room: int) -> list[str]:
    """The phrase whole if it fits in room, else its words; a word wider than room (a URL,
    a path) in pieces that end at a / where one does, else of room characters."""
    if len(phrase) <= room:
        return [phrase]
    pieces = []
    for word in phrase.split(" "):
        while len(word) > room:
            at = word.rfind("/", 0, room) + 1 or room
            pieces.append(word[:at])
            word = word[at:]
        pieces.append(word)
    return [piece for piece in pieces if piece]
