"""How the reports show what they read: durations in words, the status table's cells (whole,
or compact for a narrow terminal), the history's rows, plain tables for pipes (a terminal's
are once.report.screen's, with rich), and the objects of `once status --json`.

Text from the ledger goes through once.escape.shown: a cell never holds a control character.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from json.encoder import INFINITY
from json.encoder import encode_basestring_ascii as json_string
from typing import Any

from once.escape import shown
from once.ledger import Target
from once.ledger.fleet import Standby
from once.periods import Period, iso
from once.report import screen
from once.report.model import LIST_LIMIT, JobState, rounded
from once.report.screen import Cell, Fitted
from once.secrets import scrub, scrub_json


def tty() -> bool:
    return sys.stdout.isatty()


def write_line(text: str, as_json: bool = False) -> None:
    """A report's text on stdout, scrubbed of the ledger's secrets (as_json: only inside
    the JSON document's strings, which stays JSON)."""
    sys.stdout.write((scrub_json(text) if as_json else scrub(text)) + "\n")


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


STATUS_HEADERS = ["JOB", "SCHEDULE", "TZ", "LAST DONE", "FINISHED", "TOOK", "RUNNING",
                  "FAILED", "MISSING", "NOW", "NEXT"]

# The current period's state (JobState.current_state) in the NOW column, and its style.
NOW_WORDS = {"done": ("done", "green"), "running": ("running", "cyan"),
             "stale": ("stale", "bold yellow"), "failed": ("failed", "bold red"),
             "not-run": ("not run", "")}


def status_cells(s: JobState, now: datetime, compact: bool = False) -> list[Cell]:
    """One row of the status table; compact: the terminal's short forms (period keys as
    short_key gives them, NOW without its key)."""
    if s.sched is None:
        return [(s.name, "bold"), (s.spec if compact else s.schedule_text, ""), (s.tz, ""),
                (f"cannot read the schedule: {s.error}", "red"), *[("", "")] * 7]

    def key(text: str) -> str:
        return short_key(text, now.astimezone(s.zone).date()) if compact else text

    def ago(seconds: float) -> str:  # compact: 1h26m, not 1h 26m
        return age(seconds).replace(" ", "") if compact else age(seconds)

    last = s.last_done
    failed = s.failed
    out = sum(1 for r in failed if s.failed_out(r))
    failed_cell: Cell = (f"{len(failed)}" + (f" ({out} out)" if out else ""),
                         "bold red" if failed else "")
    missing = s.missing
    keys = s.missing_keys(1)
    missing_text = str(missing) + ("+" if s.no_row_at_least else "")
    if keys:
        missing_text += f" from {key(keys[0])}"
    next_text = "-"
    if s.next is not None and s.next_at is not None:
        next_text = f"{key(s.next.key)} in {ago((s.next_at - now).total_seconds())}"
        if compact and s.lag:  # its short key is no time it happens at: say it is a period
            next_text = f"period {next_text.replace(' in ', ' due in ', 1)}"
    return [
        (s.name, "bold"),
        ((s.spec if s.kind == "every" else s.schedule_text) if compact else s.schedule_text,
         ""),
        (s.tz, ""),
        (key(last.period) if last else "never", "green" if last else "yellow"),
        (f"{ago((now - last.finished_at).total_seconds())} ago"
         if last and last.finished_at else "-", ""),
        (took(last.duration) if last else "-", ""),
        _running_cell(s, key),
        failed_cell,
        (missing_text, "bold red" if missing else ""),
        _now_cell(s, compact),
        (next_text, ""),
    ]


def _now_cell(s: JobState, compact: bool) -> Cell:
    word, style = NOW_WORDS.get(s.current_state or "", ("-", ""))
    if s.current_state == "not-run" and s.current_done:  # some of its shards are done
        word = f"{s.current_done}/{s.shards} done"
    if compact or s.current is None:
        return (word, style)
    return (f"{s.current.key} {word}", style)


def short_key(key: str, today: date) -> str:
    """A period key as the terminal's compact table shows it: without its year in the year
    of `today` (the job's date now), a time of day alone on `today` itself, without its UTC
    offset (`22:00`, `11-29 22:00`, `11-28`, `2025-12-31`); weeks, months and the rest as
    they are. A shard's suffix stays."""
    found = _DAY_KEY.fullmatch(key)
    if found is None:
        return key
    year, month, day, clock, shard = found.groups()
    ymd = (int(year), int(month), int(day))
    text = f"{month}-{day}" if ymd[0] == today.year else f"{year}-{month}-{day}"
    if clock is not None:
        text = clock if ymd == (today.year, today.month, today.day) else f"{text} {clock}"
    return text + (shard or "")


_DAY_KEY = re.compile(r"(\d{4})-(\d\d)-(\d\d)(?:T(\d\d:\d\d)(?:[+-]\d\d:\d\d|Z))?(#\d+)?")


def _running_cell(s: JobState, key: Callable[[str], str] = str) -> Cell:
    """The latest running attempt (and how many more), yellow when one is stale."""
    running = s.running
    if not running:
        return ("-", "")
    r = running[-1]
    text = (f"{key(r.period)} {r.owner} #{r.attempt}, beat {age(s.heartbeat_age(r))} ago"
            + (" STALE" if s.is_stale(r) else "")
            + (f" OVERRUN {age(s.running_for(r))}" if s.overruns(r) else ""))
    if len(running) > 1:
        text += f" (+{len(running) - 1})"
    if s.overrunning:
        return (text, "bold red")
    return (text, "bold yellow" if any(s.is_stale(x) for x in running) else "cyan")


def render_status(states: Sequence[JobState], now: datetime, target: Target,
                  standby: str = "", wide: bool = False, more: Sequence[Fitted] = ()) -> None:
    """The status table (none without jobs), then the `more` tables, then the ledger: in a
    pipe plain and whole, one blank line between them; on a terminal fitted to its width
    (once.report.screen) unless wide. standby: how the ledger read is a standby's copy
    ('' for a primary's)."""
    # which ledger: the wrong one (or a standby far behind) looks empty or stale
    caption = f"ledger: {target.redacted}{standby}"
    if tty():
        screen.status_table(STATUS_HEADERS, [status_cells(s, now) for s in states],
                            [status_cells(s, now, compact=True) for s in states], caption,
                            wide, more)
    else:
        tables = [plain_table(STATUS_HEADERS, [status_cells(s, now) for s in states])
                  ] if states else []
        tables += [plain_table(t.headers, t.rows) for t in more]
        write_line("\n\n".join([*tables, shown(caption)]))


HISTORY_HEADERS = ["PERIOD", "ATTEMPT", "FENCE", "OWNER", "STARTED", "FINISHED", "TOOK",
                   "STATUS", "EXIT", "REASON", "LAST LINE"]
PLAIN_LAST_LINE = 200  # characters of LAST LINE when not on a terminal (there: its width)

_HISTORY_STYLE = {"done": "green", "failed": "bold red", "timed-out": "bold red",
                  "exec-failed": "bold red", "interrupted": "red", "stale": "bold yellow",
                  "running": "cyan", "taken-over": "yellow"}


def history_cells(e: dict[str, Any], compact: bool = False) -> list[Cell]:
    """One row of the history table, from an entry of `once history --json`; compact: the
    period and the times short (short_key; a time of today alone), for a narrow terminal."""
    today = _today(e["started_at"])

    def local(text: str | None) -> str:
        if not text:
            return "-"
        if not compact:
            return text[:19].replace("T", " ")
        at = datetime.fromisoformat(text)
        return at.strftime("%H:%M:%S" if at.date() == today else "%m-%d %H:%M")

    style = _HISTORY_STYLE.get(
        e["status"] if e["outcome"] in PLAIN_OUTCOMES else e["outcome"], "")
    return [(short_key(e["period"], today) if compact else e["period"], ""),
            (str(e["attempt"]), ""), (str(e["fence"]), ""),
            (e["owner"], ""), (local(e["started_at"]), ""), (local(e["finished_at"]), ""),
            (took(e["duration_s"]), ""), (status_word(e), style),
            ("-" if e["exit_code"] is None else str(e["exit_code"]), ""),
            (e["reason"] or "", ""), (e["last_line"] or "", "")]


def _today(instant: str) -> date:
    """The date now in the zone (the offset) an entry's times are shown in."""
    return datetime.now(UTC).astimezone(datetime.fromisoformat(instant).tzinfo).date()


# The columns a narrow terminal loses first (docs/how-to/monitoring.md "once history"), job's
# and fleet's ("REASON?": only while no attempt has a reason).
HISTORY_DROP = ("FENCE", "FINISHED", "REASON?", "OWNER", "REASON", "TOOK", "ATTEMPT")
FLEET_DROP = ("OWNER", "TOOK", "ATTEMPT", "EXIT")


def render_history(job: str, tz: str, entries: list[dict[str, Any]],
                   wide: bool = False) -> None:
    """A job's attempts: in a pipe a plain table, LAST LINE cut at PLAIN_LAST_LINE; on a
    terminal fitted to its width (once.report.screen), unless wide, as a pipe has it."""
    headers = [*HISTORY_HEADERS]
    headers[4] = f"STARTED ({tz})"
    rows = [history_cells(e) for e in entries]
    for row in rows:
        row[-1] = (cut_short(row[-1][0], PLAIN_LAST_LINE), row[-1][1])
    if tty():
        screen.history_table(headers, rows, [history_cells(e, compact=True) for e in entries],
                             HISTORY_DROP, f"once logs {shell_word(job)} --period P --attempt N",
                             title=job, wide=wide)
        return
    write_line(plain_table(headers, rows))


FLEET_HEADERS = ["JOB", "PERIOD", "ATTEMPT", "OWNER", "STARTED (UTC)", "TOOK", "STATUS",
                 "EXIT", "LAST LINE"]


def fleet_cells(e: dict[str, Any], compact: bool = False) -> list[Cell]:
    """One row of `once history` without JOB: the job's history row with fewer columns, its
    start in UTC (the jobs' zones differ)."""
    cells = history_cells(e, compact)
    started = datetime.fromisoformat(e["started_at"]).astimezone(UTC)
    form = ("%H:%M:%S" if started.date() == datetime.now(UTC).date() else "%m-%d %H:%M"
            ) if compact else "%Y-%m-%d %H:%M:%S"
    return [(e["job"], "bold"), cells[0], cells[1], cells[3], (started.strftime(form), ""),
            *cells[6:9], cells[10]]


def render_fleet_history(entries: list[dict[str, Any]], wide: bool = False) -> None:
    """The fleet's latest attempts, as render_history draws a job's."""
    rows = [fleet_cells(e) for e in entries]
    for row in rows:
        row[-1] = (cut_short(row[-1][0], PLAIN_LAST_LINE), row[-1][1])
    if tty():
        screen.history_table(FLEET_HEADERS, rows,
                             [fleet_cells(e, compact=True) for e in entries], FLEET_DROP,
                             "once logs JOB --period P --attempt N", job_column=0, wide=wide)
        return
    write_line(plain_table(FLEET_HEADERS, rows))


def cut_short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def shell_word(text: str) -> str:
    """A job's name as a shell reads it back (quoted when it needs to be)."""
    return shlex.quote(text)


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
    table = [list(headers), *[[scrub(shown(text)) for text, _ in row] for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in table)


def status_objects(states: Sequence[JobState],
                   drawings: dict[str, list[tuple[Period, str]]] | None = None,
                   ledger: str | None = None,
                   standby: Standby | None = None) -> list[dict[str, Any]]:
    """The array `once status --json` prints; with drawings, each job's `timeline` too;
    with ledger (a redacted URL), the ledger read, and whether it is a standby's copy, in
    each object."""
    out = []
    for s in states:
        obj = status_object(s)
        if ledger is not None:
            obj["ledger"] = ledger
            obj["standby"] = None if standby is None else {"replay_lag_s": standby.lag}
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
        "current_state": s.current_state,
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
    if not s.open_rows:  # most jobs of a fleet
        return {"running": [], "failed": 0, "failed_out": 0, "failed_periods": [],
                "last_failure": None}
    return {
        "running": [
            {"period": r.period, "attempt": r.attempt, "fence": r.fence, "owner": r.owner,
             "started_at": _local(s, r.started_at), "heartbeat_at": _local(s, r.heartbeat_at),
             "heartbeat_age_s": rounded(s.heartbeat_age(r)), "stale": s.is_stale(r),
             "stale_after_s": r.stale_after, "due": s.due(r), "overrun": s.overruns(r),
             "running_s": rounded(s.running_for(r))}
            for r in s.running
        ],
        "failed": len(s.failed),
        "failed_out": sum(1 for r in s.failed if s.failed_out(r)),
        "failed_periods": [
            {"period": r.period, "attempt": r.attempt, "interrupted": r.interrupted,
             "exit_code": r.exit_code, "finished_at": _local(s, r.finished_at),
             "attempts_left": s.attempts_left(r),
             "due": s.due(r), "last_line": s.failure_lines.get(r.period)}
            for r in s.failed[:LIST_LIMIT]
        ],
        "last_failure": (
            {"period": failure.period, "attempt": failure.attempt,
             "exit_code": failure.exit_code, "finished_at": _local(s, failure.finished_at),
             "last_line": s.failure_lines.get(failure.period)}
            if (failure := s.last_failure) is not None else None),
    }


# -- JSON as json.dumps(value, indent=2) writes it, twice as fast ----------------------------


def indented_json(value: Any) -> str:
    """json.dumps(value, indent=2), character for character, for the documents of dicts,
    lists, strings, numbers, booleans and None that the reports print. json.dumps with an
    indent encodes in Python, token by token through a generator per level (10,000 jobs of
    /api/status: 9 MB, 0.2 s of CPU); this writes each scalar with the encoder's own
    functions into one list, and each key once per document and depth."""
    parts: list[str] = []
    add = parts.append
    pads: list[str] = []  # by level: a newline and the level's indent
    keys: list[dict[str, str]] = []  # by level: a key as written there, indent and all

    def pad(level: int) -> str:
        while len(pads) <= level:
            pads.append("\n" + "  " * len(pads))
            keys.append({})
        return pads[level]

    def walk(o: Any, level: int) -> None:
        if (scalar := _JSON_SCALARS.get(type(o))) is not None:
            add(scalar(o))
        elif isinstance(o, (list, tuple)) and o:
            # A scalar item is written here, not through walk: a call less for most values of
            # a document (walk's first branch, inlined in both loops for that reason).
            inner, sep = pad(level + 1), "["
            for item in o:
                add(sep + inner)
                sep = ","
                if (scalar := _JSON_SCALARS.get(type(item))) is not None:
                    add(scalar(item))
                else:
                    walk(item, level + 1)
            add(pad(level) + "]")
        elif isinstance(o, dict) and o:
            inner, sep = pad(level + 1), "{"
            known = keys[level + 1]
            for k, v in o.items():
                if type(k) is not str:
                    add(f"{sep}{inner}{_json_key(k)}: ")
                elif (written := known.get(k)) is not None:
                    add(sep + written)
                else:
                    known[k] = written = f"{inner}{json_string(k)}: "
                    add(sep + written)
                sep = ","
                if (scalar := _JSON_SCALARS.get(type(v))) is not None:
                    add(scalar(v))
                else:
                    walk(v, level + 1)
            add(pad(level) + "}")
        else:
            add(_json_other(o))

    walk(value, 0)
    return "".join(parts)


def _json_float(o: float) -> str:
    if o != o:
        return "NaN"
    if o in (INFINITY, -INFINITY):
        return "Infinity" if o > 0 else "-Infinity"
    return float.__repr__(o)


_JSON_SCALARS: dict[type, Callable[[Any], str]] = {
    str: json_string, int: int.__repr__, float: _json_float, bool: lambda o: "true" if o
    else "false", type(None): lambda o: "null"}


def _json_key(k: Any) -> str:
    """A dict's key that is no str, as json.dumps writes it."""
    if isinstance(k, (bool, type(None))):
        return f'"{_JSON_SCALARS[type(k)](k)}"'
    if isinstance(k, float):
        return f'"{_json_float(k)}"'
    if isinstance(k, int):
        return f'"{int.__repr__(k)}"'
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def _json_other(o: Any) -> str:
    """An empty list or dict, or a subclass of a scalar's type, as json.dumps writes it."""
    if isinstance(o, (list, tuple)):
        return "[]"
    if isinstance(o, dict):
        return "{}"
    if isinstance(o, str):
        return json_string(o)
    if isinstance(o, int):
        return int.__repr__(o)
    if isinstance(o, float):
        return _json_float(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
