"""A claim that the database lost (an asynchronous standby promoted before the claim's commit
reached it) must not be confused with the claim that takes its place: the new claim gets the
same attempt number, and before schema 5 the old owner's renewals renewed the new owner's row,
both commands running side by side. Here the row is rewritten in place as the new claim would
leave it (same attempt, another claim identity and owner); the failover itself is tested
with real standbys elsewhere."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for
from ledger_sql import query
from procs import start_once


def test_an_owner_whose_claim_was_lost_is_fenced_out_at_its_next_renewal(
        backend: Any, ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    if backend.dialect == "sqlite":
        pytest.skip("one host, one file: no failover can lose a SQLite ledger's commit")
    log = tmp_path / "log"
    first = start_once("run", "--job", "j", "--every", "day", "--stale-after", "3s", "--",
                       "sh", "-c", f"echo start >> {log}; sleep 30; echo end >> {log}",
                       env=once_env)
    wait_for(lambda: log.exists() and "start" in log.read_text(), what="the command")
    stranger = "f" * 16
    query(ledger_url, f"UPDATE once_runs SET claim_id = '{stranger}', owner = 'new-owner' "
                      "WHERE job = 'j'")
    lost_at = time.monotonic()
    _, stderr = first.communicate(timeout=30)
    assert first.returncode == 70, stderr
    assert "this claim was lost" in stderr  # not "another attempt took it over": none did
    assert time.monotonic() - lost_at < 3 + 5  # by one renewal, at most its deadline
    assert "end" not in log.read_text()
    # Nothing of the old owner's reached the new claim's row: no finish, no renewal after.
    assert query(ledger_url, "SELECT status, attempt, claim_id, owner FROM once_runs") == [
        ("running", 1, stranger, "new-owner")]
