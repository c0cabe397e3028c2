"""The children that log what `once run` gave them, and the runs that start them: shared by
the watermark (test_state.py), shard (test_shards.py), command drift (test_drift.py) and
mixed-version (test_versions.py) tests; its fixture `env` is registered by tests/conftest.py.
What the children saw is counted from their own log ($LOG); what the ledger holds is read
with plain SQL.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import run_once
from ledger_sql import query

DAY = ["--every", "day"]

# Reads the watermark as an integer (0 at first), logs it, leaves it + 1.
INCREMENT = ["sh", "-c", 'n=${ONCE_STATE:-0}; echo "$ONCE_PERIOD $n" >> "$LOG"; '
             'echo $((n + 1)) > "$ONCE_STATE_OUT"']
# Logs the period and shard it was given.
SHARD_LOG = ["sh", "-c", 'echo "$ONCE_PERIOD $ONCE_SHARD $ONCE_SHARDS $ONCE_ATTEMPT" >> "$LOG"']

# Logs `start` as it begins and `end` when its work is done (`RUNNER hold`: once
# $DIR/release.$ONCE_JOB exists; else at once), each `WORD JOB PERIOD ATTEMPT FENCE PID` on
# $LOG, and notes its pid in $DIR/pid.$ONCE_JOB.$ONCE_ATTEMPT. It holds an exclusive flock on
# its period's file in $DIR for as long as it lives (the kernel lets go however it dies): when
# another attempt's command holds it, it logs `overlap` before `start`. So the log says how
# many times each period's command ran and whether two of them ran at once.
_RUNNER = r"""
import fcntl, os, sys, time
e = os.environ
job, period, attempt = e["ONCE_JOB"], e["ONCE_PERIOD"], e["ONCE_ATTEMPT"]
def log(word):
    line = f"{word} {job} {period} {attempt} {e['ONCE_FENCE']} {os.getpid()}\n"
    fd = os.open(e["LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)
safe = "".join(c if c.isalnum() else "_" for c in f"{job}.{period}")
lock = os.open(os.path.join(e["DIR"], f"lock.{safe}"), os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    log("overlap")
log("start")
with open(os.path.join(e["DIR"], f"pid.{job}.{attempt}"), "w") as note:
    note.write(str(os.getpid()))
release = os.path.join(e["DIR"], f"release.{job}")
while sys.argv[1:] == ["hold"] and not os.path.exists(release):
    time.sleep(0.05)
log("end")
"""
RUNNER = [sys.executable, "-S", "-c", _RUNNER]


def runs_logged(env: dict[str, str]) -> list[tuple[str, ...]]:
    """The RUNNER children's lines: (word, job, period, attempt, fence, pid)."""
    return [tuple(line.split()) for line in logged(env)]


def starts(env: dict[str, str]) -> Counter[tuple[str, str]]:
    """How many times each (job, period)'s command started."""
    return Counter((job, period) for word, job, period, *_ in runs_logged(env)
                   if word == "start")


def overlaps(env: dict[str, str]) -> list[tuple[str, ...]]:
    """The commands that found another attempt of their period running as they started."""
    return [line for line in runs_logged(env) if line[0] == "overlap"]


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """once_env, with the children's log ($LOG) and a directory of theirs ($DIR)."""
    return {**once_env, "LOG": str(tmp_path / "children.log"), "DIR": str(tmp_path)}


def logged(env: dict[str, str]) -> list[str]:
    path = Path(env["LOG"])
    return path.read_text().splitlines() if path.exists() else []


def once_line(stderr: str) -> str:
    """stderr must be exactly one `once:` line; return it."""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("once: "), stderr
    return lines[0]


def run(env: dict[str, str], job: str, *args: str, command: list[str],
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_once("run", "--job", job, *DAY, *args, "--", *command, env=env, timeout=timeout)


def stored_state(url: str, job: str) -> tuple[str | None, int]:
    """(watermark, version) as once_jobs holds them."""
    rows = query(url, "SELECT state, state_version FROM once_jobs WHERE job = %s"
                 if not url.startswith("sqlite") else
                 "SELECT state, state_version FROM once_jobs WHERE job = ?", (job,))
    assert len(rows) == 1, rows
    return rows[0][0], int(rows[0][1])


def day_key(days_ago: int) -> str:
    return (datetime.now(UTC) - timedelta(days=days_ago)).strftime("%Y-%m-%d")


def stable_day() -> None:
    """Tests that compute day keys here and let `once` compute them too must not straddle
    midnight UTC: wait it out when it is seconds away."""
    now = datetime.now(UTC)
    left = (now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)) - now
    if left < timedelta(seconds=120):
        time.sleep(left.total_seconds() + 1)
