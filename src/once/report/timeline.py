"""`once status JOB --timeline`: a job's recent periods drawn as cells (a report module).

Layouts, as the period unit's record says (once.units): a calendar grid for daily jobs (a
column per week, a row per weekday, like a contribution graph), a row per local day for hour
and Nh jobs, a row per local hour for minute and Nm jobs, and a strip of cells wrapped into
lines for the rest (week, month, quarter, year, cron). Cells sit at their wall-clock slot,
so a day that skips an hour for DST shows a blank cell and a day that repeats one shows an
extra cell.

In a pipe the cells are plain symbols; on a terminal, coloured glyphs (rich). once serve's
job page draws the same cells as rows of slots sized to its width (grid): a row a month for
daily jobs, where a calendar of seven weekday rows would be mostly empty for a young job and
too wide for a phone for an old one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import date, timedelta
from typing import TYPE_CHECKING, NamedTuple

from once.escape import shown
from once.periods import Period, Schedule
from once.secrets import scrub
from once.units import DAYS, GRID, HOURS

if TYPE_CHECKING:
    from once.report.model import JobState

# state: (plain symbol, terminal glyph, rich style, legend word)
STATES = {
    "done": ("#", "■", "green", "done"),
    "failed": ("x", "✗", "bold red", "failed"),
    "missing": (".", "□", "bold red", "missing"),
    "running": (">", "▶", "cyan", "running"),
    "stale": ("!", "!", "bold yellow", "stale"),
    "pending": ("-", "·", "dim", "not due yet"),
    "none": (" ", " ", "", "before the first run"),
}
LEGEND = ("done", "failed", "missing", "running", "stale", "pending")

Segment = tuple[str, str]  # (text, rich style)
Line = list[Segment]

WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
CRON_STRIP = 60  # a cron job's cells a line (a unit's: its record's)


def render(jobs: Sequence[tuple[JobState, list[tuple[Period, str]]]], tty: bool) -> None:
    """Print the jobs' drawings; text from the ledger (names, zones) with its controls
    escaped, and never read as rich markup."""
    lines: list[Line] = []
    for i, (state, cells) in enumerate(jobs):
        if i:
            lines.append([])
        lines += draw(state, cells, tty)
    if tty:
        from rich.console import Console
        from rich.text import Text

        console = Console(highlight=False)
        for line in lines:
            text = Text()
            for chunk, style in line:
                text.append(scrub(shown(chunk)), style=style or None)
            console.print(text, soft_wrap=True)
    else:
        for line in lines:
            sys.stdout.write(scrub("".join(shown(chunk) for chunk, _ in line)).rstrip() + "\n")


def draw(s: JobState, cells: list[tuple[Period, str]], tty: bool) -> list[Line]:
    """The lines for one job: a title, the cells, a legend."""
    if s.sched is None or not cells:
        return [[(s.name, "bold"), (f"  cannot draw: {s.error or 'no periods'}", "red")]]
    title: Line = [(s.name, "bold"), (f"  {s.schedule_text}, {s.tz}  ", ""),
                   (f"{cells[0][0].key} .. {cells[-1][0].key}", ""),
                   (f"  ({summary(cells)})", "")]
    body = _body(s.sched, cells, tty)
    legend: Line = []
    for state in LEGEND:
        legend += [_glyph(state, tty), (f" {STATES[state][3]}   ", "")]
    return [title, [], *body, [], legend]


def summary(cells: list[tuple[Period, str]]) -> str:
    """How many periods are drawn, and how many in each state: `41 periods: 40 done, ...`."""
    counts = {state: sum(1 for _, c in cells if c == state) for state in STATES}
    each = ", ".join(f"{counts[k]} {STATES[k][3]}" for k in LEGEND if counts[k])
    return f"{len(cells)} period{'' if len(cells) == 1 else 's'}: {each}"


def _glyph(state: str, tty: bool) -> Segment:
    plain, glyph, style, _ = STATES.get(state, STATES["none"])
    return (glyph, style) if tty else (plain, "")


def _body(sched: Schedule, cells: list[tuple[Period, str]], tty: bool) -> list[Line]:
    """The layout the period unit's record names (never the spec parsed again): a calendar
    for days, a row per day or per hour, a strip for the rest and for cron."""
    unit = sched.unit
    if unit is None:
        return _strip(cells, tty, CRON_STRIP)
    if unit.timeline == GRID:
        return _calendar(cells, tty)
    if unit.timeline in (DAYS, HOURS):
        return _rows(cells, tty, by_day=unit.timeline == DAYS,
                     unit=unit.length // timedelta(minutes=1))
    return _strip(cells, tty, unit.strip)


def _calendar(cells: list[tuple[Period, str]], tty: bool) -> list[Line]:
    """Columns are ISO weeks (Monday first), rows are weekdays."""
    def monday(day: date) -> date:
        return day - timedelta(days=day.weekday())

    days = [(p.start.date(), state) for p, state in cells]
    weeks = sorted({monday(d) for d, _ in days})
    column = {week: i for i, week in enumerate(weeks)}
    grid = [[("", "none")] * len(weeks) for _ in range(7)]
    for day, state in days:
        grid[day.weekday()][column[monday(day)]] = (day.isoformat(), state)
    header = [" "] * (2 * len(weeks) + 3)
    free = 0
    for i, week in enumerate(weeks):
        firsts = [week + timedelta(days=k) for k in range(7)
                  if (week + timedelta(days=k)).day == 1]
        if i == 0 or firsts:
            month = (firsts[0] if firsts else week).month
            label = MONTHS[month - 1]
            at = 2 * i
            if at >= free:
                header[at:at + 3] = list(label)
                free = at + 4
    lines: list[Line] = [[("    " + "".join(header).rstrip(), "")]]
    for weekday in range(7):
        line: Line = [(f"{WEEKDAYS[weekday]} ", "")]
        for _, state in grid[weekday]:
            line += [_glyph(state, tty), (" ", "")]
        lines.append(line)
    return lines


Slotted = dict[str, dict[int, tuple[Period, str]]]  # a row's label: its periods by slot


def _rows(cells: list[tuple[Period, str]], tty: bool, by_day: bool, unit: int) -> list[Line]:
    """A row per local day (slots of `unit` minutes from midnight) or per local hour."""
    per_row, rows = _slotted(cells, by_day, unit)
    width = 3 if per_row <= 12 else 1
    label_width = max(len(label) for label in rows)
    header = [" "] * (per_row * width + 3)
    for slot, mark in _marks(per_row, by_day, unit):
        header[slot * width:slot * width + 2] = list(mark)
    lines: list[Line] = [[(" " * (label_width + 2) + "".join(header).rstrip(), "")]]
    for label, slots in rows.items():
        line: Line = [(label.ljust(label_width + 2), "")]
        for slot in range(max(per_row, max(slots) + 1)):
            line.append(_glyph(slots[slot][1] if slot in slots else "none", tty))
            if width > 1:
                line.append((" " * (width - 1), ""))
        lines.append(line)
    return lines


def _slotted(cells: list[tuple[Period, str]], by_day: bool,
             unit: int) -> tuple[int, Slotted]:
    """The slots a row has, and the rows (a local day's, or a local hour's) in order."""
    per_row = (24 * 60 if by_day else 60) // unit
    rows: Slotted = {}
    last_slot: dict[str, int] = {}
    for period, state in cells:
        start = period.start
        label = start.date().isoformat() if by_day else start.isoformat(timespec="hours")[:13]
        wall = start.hour * 60 + start.minute if by_day else start.minute
        slot = wall // unit
        if label not in rows:
            rows[label] = {}
        elif slot <= last_slot[label]:
            slot = last_slot[label] + 1  # a repeated wall time (DST fall-back): next cell
        rows[label][slot] = (period, state)
        last_slot[label] = slot
    return per_row, rows


def _marks(per_row: int, by_day: bool, unit: int) -> list[tuple[int, str]]:
    """The hours (of a day's row) or minutes (of an hour's) written over some slots."""
    step = 1 if per_row <= 12 else next((k for k in (3, 5, 4, 6) if per_row % k == 0),
                                        per_row)
    if by_day and per_row > 12:
        step = 3 if per_row == 24 else step
    return [(slot, f"{slot * unit // 60 if by_day else slot * unit:02d}")
            for slot in range(0, per_row, step)]


def _strip(cells: list[tuple[Period, str]], tty: bool, per_line: int) -> list[Line]:
    label_width = max(len(p.key) for p, _ in cells)
    gap = " " if per_line <= 12 else ""
    lines: list[Line] = []
    for i in range(0, len(cells), per_line):
        chunk = cells[i:i + per_line]
        line: Line = [(chunk[0][0].key.ljust(label_width + 2), "")]
        for _, state in chunk:
            line.append(_glyph(state, tty))
            if gap:
                line.append((gap, ""))
        lines.append(line)
    return lines



# -- once serve's job page --------------------------------------------------------------------


class Grid(NamedTuple):
    """A job's periods as rows of slots, for a page that sizes them to its width (once serve's
    job page): each row a label and a (period, state) or None at each slot, and the labels
    written over some slots (their number, its text). A daily job's row is a month (a slot a
    day of it), an hourly one's a day and a minute one's an hour, as the terminal's; the rest
    a strip of the unit's cells a row."""

    slots: int
    marks: list[tuple[int, str]]
    rows: list[tuple[str, list[tuple[Period, str] | None]]]


def grid(sched: Schedule, cells: list[tuple[Period, str]]) -> Grid:
    """The job's cells in the rows its unit's record names (Grid's docstring)."""
    unit = sched.unit
    if not cells:
        return Grid(0, [], [])
    if unit is not None and unit.timeline == GRID:
        rows: Slotted = {}
        for period, state in cells:
            start = period.start
            rows.setdefault(f"{start.year:04d}-{start.month:02d}", {})[start.day - 1] = (
                period, state)
        return _grid(31, [(day - 1, str(day)) for day in (1, 5, 10, 15, 20, 25, 30)], rows)
    if unit is not None and unit.timeline in (DAYS, HOURS):
        minutes = unit.length // timedelta(minutes=1)
        by_day = unit.timeline == DAYS
        per_row, rows = _slotted(cells, by_day, minutes)
        # a few marks, however many slots: every third hour of a day, every quarter hour
        marks = range(0, 24 * 60, 180) if by_day else range(0, 60, 15)
        return _grid(per_row, [(m // minutes, f"{m // 60 if by_day else m:02d}")
                               for m in marks if m % minutes == 0], rows)
    per_line = CRON_STRIP if unit is None else unit.strip
    slots = min(per_line, len(cells))
    chunks = [cells[i:i + per_line] for i in range(0, len(cells), per_line)]
    return Grid(slots, [], [(chunk[0][0].key, [*chunk, *[None] * (slots - len(chunk))])
                            for chunk in chunks])


def _grid(per_row: int, marks: list[tuple[int, str]], rows: Slotted) -> Grid:
    """Rows of slots, each as long as the longest (a DST fall-back's extra slot)."""
    slots = max(per_row, *(max(row) + 1 for row in rows.values()))
    return Grid(slots, marks, [(label, [row.get(slot) for slot in range(slots)])
                               for label, row in rows.items()])
