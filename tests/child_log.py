"""The children that log what `once run` gave them, and the runs that start them: shared by
the watermark (test_state.py), shard (test_shards.py) and command drift (test_drift.py)
tests; its fixture `env` is registered by tests/conftest.py. What the children saw is
counted from their own log ($LOG); what the ledger holds is read with plain SQL.
"""

from __future__ import annotations

import subprocess
import time
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
