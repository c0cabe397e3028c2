"""once's own lines on stderr: `once: ...`, escaped to one line of printable text, or with
--log-format json one JSON object a line. Every command says what it has to say through say(),
scrubbed of the ledger's secrets (once.secrets).

Standard library only (and once.escape, once.secrets): `once run`, the hot path, says its
lines here too.
"""

from __future__ import annotations

import sys
from typing import Protocol

from once.secrets import scrub_json, scrub_line

QUIET, NORMAL, VERBOSE = 0, 1, 2  # -q, the default, -v
ERROR = QUIET  # a message at this level is shown even with -q: "log only errors"
_JSON_LEVELS = {ERROR: "error", NORMAL: "warning", VERBOSE: "info"}


class Voice(Protocol):
    """How a run says its lines (once.run.flow.Settings)."""

    verbosity: int
    log_format: str  # "text" or "json"
    owner: str
    context: dict[str, object]  # job, period, attempt: for logs


def say(message: str, settings: Voice | None = None, level: int = NORMAL,
        event: str = "message", json_level: str | None = None) -> None:
    """One `once:` line on stderr (or one JSON object, --log-format json), unless the
    verbosity is below its level (ERROR: always). json_level overrides the record's level,
    which is otherwise error, warning or info by `level`."""
    verbosity = settings.verbosity if settings else NORMAL
    if verbosity < level:
        return
    if settings is None or settings.log_format != "json":
        from once.escape import shown  # an owner or a reason may hold control characters

        _write(scrub_line(f"once: {shown(message)}"))
        return
    import json
    from datetime import UTC, datetime

    record = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"),
              "level": json_level or _JSON_LEVELS.get(level, "info"), "event": event,
              **settings.context, "owner": settings.owner, "message": message}
    _write(scrub_json(json.dumps(record)))


def _write(line: str) -> None:
    """A line on stderr; one that cannot be written (a full disk, a reader gone, stderr
    closed) is lost, and changes nothing of what once does: a leader whose `leading` line
    failed still ran and released its term."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):  # ValueError: closed; None: no stderr
        pass
