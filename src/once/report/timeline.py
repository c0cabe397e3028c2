"""`once status JOB --timeline`: a job's recent periods drawn as cells (a report module).

Layouts, as the period unit's record says (once.units): a calendar grid for daily jobs (a
column per week, a row per weekday, like a contribution graph), a row per local day for hour
and Nh jobs, a row per local hour for minute and Nm jobs, and a strip of cells wrapped into
lines for the rest (week, month, quarter, year, cron). Cells sit at their wall-clock slot,
so a day that skips an hour for DST shows a blank cell and a day that repeats one shows an
extra cell.

In a pipe the cells are plain symbols; on a terminal, coloured glyphs (rich).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import date, timedelta
from typing import TYPE_CHECKING

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
    counts = {state: sum(1 for _, c in cells if c == state) for state in STATES}
    summary = ", ".join(f"{counts[k]} {STATES[k][3]}" for k in LEGEND if counts[k])
    title: Line = [(s.name, "bold"), (f"  {s.schedule_text}, {s.tz}  ", ""),
                   (f"{cells[0][0].key} .. {cells[-1][0].key}", ""),
                   (f"  ({len(cells)} period{'' if len(cells) == 1 else 's'}: {summary})", "")]
    body = _body(s.sched, cells, tty)
    legend: Line = []
    for state in LEGEND:
        legend += [_glyph(state, tty), (f" {STATES[state][3]}   ", "")]
    return [title, [], *body, [], legend]


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


def _rows(cells: list[tuple[Period, str]], tty: bool, by_day: bool, unit: int) -> list[Line]:
    """A row per local day (slots of `unit` minutes from midnight) or per local hour."""
    per_row = (24 * 60 if by_day else 60) // unit
    width = 3 if per_row <= 12 else 1
    rows: dict[str, dict[int, str]] = {}
    order: list[str] = []
    last_slot: dict[str, int] = {}
    for period, state in cells:
        start = period.start
        label = start.date().isoformat() if by_day else start.isoformat(timespec="hours")[:13]
        wall = start.hour * 60 + start.minute if by_day else start.minute
        slot = wall // unit
        if label not in rows:
            rows[label] = {}
            order.append(label)
        elif slot <= last_slot[label]:
            slot = last_slot[label] + 1  # a repeated wall time (DST fall-back): next cell
        rows[label][slot] = state
        last_slot[label] = slot
    label_width = max(len(label) for label in order)
    step = 1 if width == 3 else next((k for k in (3, 5, 4, 6) if per_row % k == 0), per_row)
    if by_day and width == 1:
        step = 3 if per_row == 24 else step
    header = [" "] * (per_row * width + 3)
    for slot in range(0, per_row, step):
        value = slot * unit // 60 if by_day else slot * unit
        header[slot * width:slot * width + 2] = list(f"{value:02d}")
    lines: list[Line] = [[(" " * (label_width + 2) + "".join(header).rstrip(), "")]]
    for label in order:
        slots = rows[label]
        line: Line = [(label.ljust(label_width + 2), "")]
        for slot in range(max(per_row, max(slots) + 1)):
            line.append(_glyph(slots.get(slot, "none"), tty))
            if width > 1:
                line.append((" " * (width - 1), ""))
        lines.append(line)
    return lines


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

