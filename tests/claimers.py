"""Many claimers racing over many periods through the Python API, in separate processes."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from datetime import UTC, datetime, timedelta

from once.ledger import Job, open_ledger, parse_url

JOB = Job("api-race", "every", "hour", "UTC")
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _claim_all(args: tuple[str, int, int, multiprocessing.Barrier]) -> list[int]:
    url, periods, me, barrier = args
    won = []
    # A claim waits up to `timeout` for SQLite's write lock, which 15 others take in turn: on a
    # loaded two-core machine one waited past 30 s ("database is locked").
    with open_ledger(parse_url(url), timeout=120) as ledger:
        ledger.connect()
        barrier.wait()
        for i in range(periods):
            start = EPOCH + timedelta(hours=i)
            claim = ledger.claim(JOB, f"p{i:04d}", start, start + timedelta(hours=1),
                                 f"claimer-{me}")
            if claim.won:
                won.append(i)
    return won


def race_periods(url: str, periods: int, claimers: int) -> dict[int, int]:
    """How many claimers won each period (the answer must be 1 for every period)."""
    with open_ledger(parse_url(url)) as ledger:  # create the tables before the race
        ledger.claim(JOB, "warm-up", EPOCH, EPOCH, "warm-up")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(claimers)
        with ctx.Pool(claimers) as pool:
            results = pool.map(_claim_all, [(url, periods, n, barrier)
                                            for n in range(claimers)])
    return dict(Counter(i for won in results for i in won))
