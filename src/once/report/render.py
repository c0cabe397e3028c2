"""How the reports show what they read: durations in words, the status table's cells, the
history's rows, plain tables for pipes and rich tables for terminals (rich is imported only
when one is drawn), and the objects of `once status --json`.

Text from the ledger goes through once.escape.shown: a cell never holds a control character.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from once.escape import shown
from once.ledger import Target
from once.periods import Period, iso
from once.report.model import LIST_LIMIT, JobState, rounded


def tty() -> bool:
    return sys.stdout.isatty()


def write_line(text: str) -> None:
    sys.stdout.write(text + "\n")


def say(message: str) -> None:
    print(f"once: {shown(message)}", file=sys.stderr)


def age(seconds: float) -> str:
    """A short duration: 42s, 5m, 3h 12m, 2d 4h."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def took(seconds: float | None) -> str:
    """How long an attempt took: 12.3s under a minute, then as age()."""
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 60 else age(seconds)


Cell = tuple[str, str]  # (text, rich style; "" for none)

STATUS_HEADERS = ["JOB", "SCHEDULE", "TZ", "LAST DONE", "FINISHED", "TOOK", "RUNNING",
                  "FAILED", "MISSING", "NEXT"]


def status_cells(s: JobState, now: datetime) -> list[Cell]:
    """One row of the status table."""
    if s.sched is None:
        return [(s.name, "bold"), (s.schedule_text, ""), (s.tz, ""),
                (f"cannot read the schedule: {s.error}", "red"), *[("", "")] * 6]
    last = s.last_done
    failed = s.failed
    out = sum(1 for r in failed if s.failed_out(r))
    failed_cell: Cell = (f"{len(failed)}" + (f" ({out} out)" if out else ""),
                         "bold red" if failed else "")
    missing = s.missing
    keys = s.missing_keys(1)
    missing_text = str(missing) + ("+" if s.no_row_at_least else "")
    if keys:
        missing_text += f" from {keys[0]}"
    next_text = "-"
    if s.next is not None and s.next_at is not None:
        next_text = f"{s.next.key} in {age((s.next_at - now).total_seconds())}"
    return [
        (s.name, "bold"),
        (s.schedule_text, ""),
        (s.tz, ""),
        (last.period if last else "never", "green" if last else "yellow"),
        (f"{age((now - last.finished_at).total_seconds())} ago"
         if last and last.finished_at else "-", ""),
        (took(last.duration) if last else "-", ""),
        _running_cell(s),
        failed_cell,
        (missing_text, "bold red" if missing else ""),
        (next_text, ""),
    ]


def _running_cell(s: JobState) -> Cell:
    """The latest running attempt (and how many more), yellow when one is stale."""
    running = s.running
    if not running:
        return ("-", "")
    r = running[-1]
    text = (f"{r.period} {r.owner} #{r.attempt}, beat {age(s.heartbeat_age(r))} ago"
            + (" STALE" if s.is_stale(r) else ""))
    if len(running) > 1:
        text += f" (+{len(running) - 1})"
    return (text, "bold yellow" if any(s.is_stale(x) for x in running) else "cyan")


def render_status(states: Sequence[JobState], now: datetime, target: Target) -> None:
    rows = [status_cells(s, now) for s in states]
    caption = f"ledger: {target.redacted}"  # which ledger: the wrong one looks empty or stale
    if tty():
        render_rich(STATUS_HEADERS, rows, caption=caption)
    else:
        write_line(plain_table(STATUS_HEADERS, rows) + "\n\n" + shown(caption))


HISTORY_HEADERS = ["PERIOD", "ATTEMPT", "FENCE", "OWNER", "STARTED", "FINISHED", "TOOK",
                   "STATUS", "EXIT", "REASON", "LAST LINE"]
PLAIN_LAST_LINE = 200  # characters of LAST LINE when not on a terminal (there: its width)

_HISTORY_STYLE = {"done": "green", "failed": "bold red", "timed-out": "bold red",
                  "exec-failed": "bold red", "interrupted": "red", "stale": "bold yellow",
                  "running": "cyan", "taken-over": "yellow"}


def history_cells(e: dict[str, Any]) -> list[Cell]:
    """One row of the history table, from an entry of `once history --json`."""

    def local(text: str | None) -> str:
        return text[:19].replace("T", " ") if text else "-"

    style = _HISTORY_STYLE.get(
        e["status"] if e["outcome"] in PLAIN_OUTCOMES else e["outcome"], "")
    return [(e["period"], ""), (str(e["attempt"]), ""), (str(e["fence"]), ""),
            (e["owner"], ""), (local(e["started_at"]), ""), (local(e["finished_at"]), ""),
            (took(e["duration_s"]), ""), (status_word(e), style),
            ("-" if e["exit_code"] is None else str(e["exit_code"]), ""),
            (e["reason"] or "", ""), (e["last_line"] or "", "")]


def render_history(job: str, tz: str, entries: list[dict[str, Any]]) -> None:
    rows = [history_cells(e) for e in entries]
    headers = [*HISTORY_HEADERS]
    headers[4] = f"STARTED ({tz})"
    if tty():
        render_rich(headers, rows, title=job, cut=len(headers) - 1)
    else:
        for row in rows:
            row[-1] = (cut_short(row[-1][0], PLAIN_LAST_LINE), "")
        write_line(plain_table(headers, rows))


def cut_short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


# Outcomes that say no more than the status itself (older ledgers stored `exited`).
PLAIN_OUTCOMES = (None, "exited", "done", "failed")


def status_word(entry: dict[str, Any]) -> str:
    """done, failed, failed (timed-out), running, stale, taken-over."""
    status_, outcome = entry["status"], entry["outcome"]
    if status_ == "running":
        return str(outcome)
    return status_ if outcome in PLAIN_OUTCOMES else f"{status_} ({outcome})"


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    """Columns aligned with spaces: no colour, no box drawing, one line a row."""
    table = [list(headers), *[[shown(text) for text, _ in row] for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in table)


def render_rich(headers: Sequence[str], rows: Sequence[Sequence[Cell]], title: str = "",
                caption: str = "", cut: int | None = None) -> None:
    """A table for the terminal; the column numbered `cut` is one line each, cut short
    (…) to what the terminal's width leaves it, where the others fold."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False)
    cells = [[shown(text) for text, _ in row] for row in rows]
    # Text objects, never strings: rich would read a job named `x[/]y` or `[link=…]` as markup.
    table = Table(box=box.SIMPLE_HEAD, title=Text(shown(title)) if title else None,
                  caption=Text(shown(caption)) if caption else None,
                  header_style="bold", title_justify="left", caption_justify="left")
    for number, header in enumerate(headers):
        if number == cut:
            others = sum(max([len(header_), *(len(row[i]) for row in cells)]) + 3
                         for i, header_ in enumerate(headers) if i != cut)
            table.add_column(Text(header), overflow="ellipsis", no_wrap=True,
                             max_width=max(len(header), console.width - others - 4))
        else:
            table.add_column(Text(header), overflow="fold")
    for row, texts in zip(rows, cells, strict=True):
        table.add_row(*[Text(text, style=style)
                        for text, (_, style) in zip(texts, row, strict=True)])
    console.print(table)


def status_objects(states: Sequence[JobState],
                   drawings: dict[str, list[tuple[Period, str]]] | None = None,
                   ledger: str | None = None) -> list[dict[str, Any]]:
    """The array `once status --json` prints; with drawings, each job's `timeline` too;
    with ledger (a redacted URL), the ledger read, in each object."""
    out = []
    for s in states:
        obj = status_object(s)
        if ledger is not None:
            obj["ledger"] = ledger
        if drawings is not None:
            obj["timeline"] = [{"period": p.key, "start": iso(p.start), "state": cell}
                               for p, cell in drawings.get(s.name, [])]
        out.append(obj)
    return out


def status_object(s: JobState) -> dict[str, Any]:
    """A job's entry in `once status --json`."""
    last = s.last_done
    return {
        "job": s.name,
        "kind": s.kind,
        "schedule": s.spec,
        "tz": s.tz,
        "lag": s.lag,
        "max_attempts": s.max_attempts,
        "stale_after_s": s.stale_after,
        "first_period": s.first.key if s.first else None,
        "last_done": last.period if last else None,
        "last_finished_at": _local(s, last.finished_at) if last else None,
        "last_duration_s": rounded(last.duration) if last else None,
        **_open_rows_object(s),
        "missing": s.missing,
        "missing_at_least": s.no_row_at_least,
        "missing_periods": s.missing_keys(),
        "missing_last": s.last_missing,
        "due_through": s.due_last.key if s.due_last else None,
        "current": s.current.key if s.current else None,
        "next": s.next.key if s.next else None,
        "next_at": _local(s, s.next_at),
        "fires": s.fires,
        "error": s.error or None,
    }


def _local(s: JobState, instant: datetime | None) -> str | None:
    """An instant in the job's zone, as the JSON outputs show it."""
    return iso(instant.astimezone(s.zone)) if instant is not None else None


def _open_rows_object(s: JobState) -> dict[str, Any]:
    """The running, failed and last failed rows of a job's `once status --json` entry."""
    return {
        "running": [
            {"period": r.period, "attempt": r.attempt, "fence": r.fence, "owner": r.owner,
             "started_at": _local(s, r.started_at), "heartbeat_at": _local(s, r.heartbeat_at),
             "heartbeat_age_s": rounded(s.heartbeat_age(r)), "stale": s.is_stale(r),
             "stale_after_s": r.stale_after, "due": s.due(r)}
            for r in s.running
        ],
        "failed": len(s.failed),
        "failed_out": sum(1 for r in s.failed if s.failed_out(r)),
        "failed_periods": [
            {"period": r.period, "attempt": r.attempt, "exit_code": r.exit_code,
             "finished_at": _local(s, r.finished_at),
             "attempts_left": max(0, s.max_attempts - r.attempt),
             "due": s.due(r), "last_line": s.failure_lines.get(r.period)}
            for r in s.failed[:LIST_LIMIT]
        ],
        "last_failure": (
            {"period": failure.period, "attempt": failure.attempt,
             "exit_code": failure.exit_code, "finished_at": _local(s, failure.finished_at),
             "last_line": s.failure_lines.get(failure.period)}
            if (failure := s.last_failure) is not None else None),
    }
