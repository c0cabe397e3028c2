"""A failed run says so in one `once:` line of its own (issue 36): job, period, attempt N of
M, the exit status or signal, and what comes next; under -q too (cron mails it), a JSON event
under --log-format json. Every backend."""

from __future__ import annotations

import json

import pytest

from helpers import run_once

pytestmark = pytest.mark.tables_made  # none is about a first use

FAIL = ["--", "sh", "-c", "echo oops >&2; exit 3"]


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("once: ")]


def test_each_failure_says_its_attempt_and_what_comes_next(once_env: dict[str, str]) -> None:
    said = []
    for _ in range(3):
        done = run_once("run", "-q", "--job", "bill", "--every", "day", *FAIL, env=once_env)
        assert done.returncode == 3
        assert "oops" in done.stderr  # the command's own line, passed through
        said += _lines(done.stderr)
    assert len(said) == 3, said
    period = said[0].split()[2].rstrip(":")
    assert said[0] == (f"once: bill {period}: failed (exit 3), attempt 1 of 3; the next fire "
                       f"retries it")
    assert said[1].endswith("attempt 2 of 3; the next fire retries it")
    assert said[2].endswith(f"attempt 3 of 3; no attempts left: `once rerun --job bill "
                            f"--period {period}` runs it again")


def test_a_signal_and_a_json_event(once_env: dict[str, str]) -> None:
    killed = run_once("run", "--job", "k", "--every", "day", "--", "sh", "-c", "kill -9 $$",
                      env=once_env)
    assert killed.returncode == 137
    assert _lines(killed.stderr)[-1].endswith(
        "failed (killed by SIGKILL), attempt 1 of 3; the next fire retries it")
    logged = run_once("run", "--log-format", "json", "--job", "j", "--every", "day",
                      "--max-attempts", "1", "--", "false", env=once_env)
    events = [json.loads(line) for line in logged.stderr.splitlines()]
    failed = [e for e in events if e["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["level"] == "error" and failed[0]["attempt"] == 1
    assert "no attempts left" in failed[0]["message"]


def test_a_timeout_says_its_attempt_too(once_env: dict[str, str]) -> None:
    done = run_once("run", "-q", "--job", "t", "--every", "day", "--timeout", "1s", "--",
                    "sleep", "30", env=once_env)
    assert done.returncode == 124
    (line,) = _lines(done.stderr)
    assert "timed out after --timeout 1s; recorded failed (attempt 1 of 3; the next fire " \
           "retries it)" in line
