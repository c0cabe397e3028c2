"""Command drift, on every backend: the command's fingerprint, `--require-same-command` and
`--version-tag`.

Real `once` processes against real databases (children and helpers: tests/child_log.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from child_log import DAY, SHARD_LOG, logged, once_line, run
from helpers import run_once
from ledger_sql import query
from once.run.flow import command_hash

pytestmark = [pytest.mark.usefixtures("ledger_url"), pytest.mark.tables_made]


def test_require_same_command_refuses_a_different_command(env: dict[str, str], tmp_path: Path,
                                                          ledger_url: str) -> None:
    assert run(env, "deploy", "--lag", "1", command=["sh", "-c", "exit 0"]).returncode == 0
    marker = tmp_path / "ran"
    before = query(ledger_url, "SELECT count(*) FROM once_attempts")
    refused = run(env, "deploy", "--require-same-command",
                  command=["touch", str(marker)])
    assert refused.returncode == 2
    assert "different command" in once_line(refused.stderr)
    assert not marker.exists()
    assert query(ledger_url, "SELECT count(*) FROM once_attempts") == before
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(1,)]
    # Without the flag, whichever command fires runs.
    assert run(env, "deploy", command=["touch", str(marker)]).returncode == 0
    assert marker.exists()


def test_require_same_command_runs_the_same_command(env: dict[str, str],
                                                    ledger_url: str) -> None:
    # The first run of a job has nothing to compare with.
    assert run(env, "deploy", "--require-same-command", "--lag", "1",
               command=SHARD_LOG).returncode == 0
    result = run(env, "deploy", "--require-same-command", command=SHARD_LOG)
    assert result.returncode == 0, result.stderr
    assert len(logged(env)) == 2


def test_version_tag_is_part_of_the_fingerprint(env: dict[str, str], ledger_url: str) -> None:
    args = ["--require-same-command"]
    assert run(env, "tagged", *args, "--version-tag", "v1", "--lag", "2",
               command=["true"]).returncode == 0
    refused = run(env, "tagged", *args, "--version-tag", "v2", "--lag", "1",
                  command=["true"])
    assert refused.returncode == 2 and "different command" in once_line(refused.stderr)
    untagged = run(env, "tagged", *args, "--lag", "1", command=["true"])
    assert untagged.returncode == 2
    assert run(env, "tagged", *args, "--version-tag", "v1", "--lag", "1",
               command=["true"]).returncode == 0
    assert command_hash(["true"], "v1") != command_hash(["true"], "v2") \
        != command_hash(["true"])


def test_fingerprints_are_kept_in_the_history(env: dict[str, str], ledger_url: str) -> None:
    assert run(env, "drift", "--lag", "2", command=["true"]).returncode == 0
    assert run(env, "drift", "--lag", "1", command=["sh", "-c", "true"]).returncode == 0
    assert run(env, "drift", "--version-tag", "abc123", command=["true"]).returncode == 0
    rows = query(ledger_url, "SELECT period, command_hash FROM once_attempts ORDER BY period")
    assert [h for _, h in rows] == [command_hash(["true"]), command_hash(["sh", "-c", "true"]),
                                    command_hash(["true"], "abc123")]
    assert len({h for _, h in rows}) == 3
    # Argument boundaries count: `a b` is not `a` `b`.
    assert command_hash(["echo", "a b"]) != command_hash(["echo", "a", "b"])


def test_catchup_and_takeovers_record_the_fingerprint(env: dict[str, str],
                                                      ledger_url: str) -> None:
    result = run_once("catchup", "--job", "drift", *DAY, "--since", "2026-03-01", "--until",
                      "2026-03-02", "--version-tag", "t", "--", "false", env=env)
    assert result.returncode == 1
    retried = run_once("catchup", "--job", "drift", *DAY, "--since", "2026-03-01",
                       "--until", "2026-03-02", "--", "true", env=env)
    assert retried.returncode == 0, retried.stderr
    rows = query(ledger_url, "SELECT period, attempt, command_hash FROM once_attempts "
                             "ORDER BY period, attempt")
    assert rows == [("2026-03-01", 1, command_hash(["false"], "t")),
                    ("2026-03-01", 2, command_hash(["true"])),
                    ("2026-03-02", 1, command_hash(["true"]))]
