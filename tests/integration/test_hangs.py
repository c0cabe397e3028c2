"""A PostgreSQL server that stops answering never holds `once` for ever: the watchdog."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest

from once.ledger import Job, LedgerError, open_ledger, parse_url


def test_a_claim_on_a_hung_backend_fails_within_the_watchdog(ledger_url: str) -> None:
    if not ledger_url.startswith("postgresql"):
        pytest.skip("the watchdog is PostgreSQL's (PyMySQL and sqlite3 have timeouts)")
    job = Job("hung", "every", "day", "UTC", stale_after=3.0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with open_ledger(parse_url(ledger_url), timeout=1.0) as ledger:
        ledger.claim(job, "warm-up", start, start + timedelta(days=1), "me")
        backend = ledger._conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        os.kill(backend, signal.SIGSTOP)  # the server process behind our connection
        try:
            began = time.monotonic()
            with pytest.raises(LedgerError):
                ledger.claim(job, "2026-01-02", start, start + timedelta(days=1), "me")
            assert time.monotonic() - began < 30  # the watchdog fires at 5 s
        finally:
            os.kill(backend, signal.SIGCONT)
