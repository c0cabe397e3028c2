"""The harness of the period tables, test_periods_table.py and test_periods_cron_dst.py.

A case is numbered so that a failure names it: (n, spec, zone, instant, key, start, end), the
instant written with the offset the zone uses at that moment and the bounds as iso() strings,
so that the offsets are checked too. What needs a fresh interpreter (what is imported, what
hangs) runs in a child on the source tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from once.periods import Period, Schedule, iso

SRC = str(Path(__file__).resolve().parents[1] / "src")
LH = "Australia/Lord_Howe"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def shown(period: Period) -> tuple[str, str, str]:
    return period.key, iso(period.start), iso(period.end)


def check_containing(schedule: Schedule, n: int, instant: str, key: str, start: str,
                     end: str) -> Period:
    """The period containing the instant is (key, start, end), in the schedule's zone, and
    its key names it (every start in a table is a period's, so every key round-trips)."""
    period = schedule.containing(at(instant))
    assert shown(period) == (key, start, end), f"case {n}"
    assert period.start.tzinfo is schedule.tz and period.end.tzinfo is schedule.tz
    assert schedule.from_key(key) == period, f"case {n}"
    return period


def in_child(script: str, timeout: float = 60) -> None:
    """Run a Python script in a fresh interpreter on src/; it must succeed in silence."""
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path), timeout=timeout)
    assert (done.returncode, done.stderr) == (0, "")
