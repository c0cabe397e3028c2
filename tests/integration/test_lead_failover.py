"""`once lead` through a PostgreSQL failover (tests/replicas.py: real primaries and standbys
from Debian's binaries): a term is never handed out twice, even by a promoted standby that
lacks the latest terms; a synchronous failover leaves no two children alive at once.

Without Debian's PostgreSQL binaries or socat these skip, unless ONCE_TEST_REPLICAS=required
(CI), which makes them fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ONCE, run_once, wait_for
from lead_log import child, judge, spans, stop_leads
from replicas import REQUIRED, Pair, missing

pytestmark = [pytest.mark.skipif(bool(missing()) and not REQUIRED, reason=missing() or "-"),
              pytest.mark.slow]


@pytest.fixture(scope="session")
def sync_pair() -> Iterator[Pair]:
    pair = Pair("lead-sync", sync=True)
    yield pair
    pair.destroy()


@pytest.fixture(scope="session")
def async_pair() -> Iterator[Pair]:
    pair = Pair("lead-async", sync=False, relayed=True)
    yield pair
    pair.destroy()


def _ledger(pair: Pair, tmp_path: Path) -> tuple[str, dict[str, str], str]:
    name = "once_l_" + uuid.uuid4().hex[:12]
    pair.primary.sql(f"CREATE DATABASE {name}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"),
               ONCE_DATABASE_URL=pair.multi_host_url(name))
    made = run_once("schema", env=env)
    assert made.returncode == 0, made.stderr
    return name, env, pair.multi_host_url(name)


def _lead(env: dict[str, str], log: Path, lease: str) -> subprocess.Popen[str]:
    return subprocess.Popen([ONCE, "lead", "--name", "beat", "--lease", lease, "--rejoin",
                             "--", *child(log)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _terms_after(log: Path, since: float) -> list[int]:
    return [s.term for s in spans(log) if s.first > since]


def test_terms_outgrow_a_promoted_standby_that_lacks_the_latest(async_pair: Pair,
                                                                tmp_path: Path) -> None:
    name, env, _ = _ledger(async_pair, tmp_path)
    log = tmp_path / "children.log"
    procs = [_lead(env, log, "3s") for _ in range(4)]
    try:
        wait_for(lambda: spans(log), timeout=60, what="a leader's child")
        async_pair.caught_up()
        assert async_pair.relay is not None
        async_pair.relay.pause()  # from here on the standby receives nothing
        # Terms the standby never sees: each SIGTERM hands the lease over.
        for _ in range(2):
            leader = max(spans(log), key=lambda s: s.first)
            os.kill(leader.pid, signal.SIGTERM)  # the child ends: its term is released
            wait_for(lambda term=leader.term: max(s.term for s in spans(log)) > term,
                     timeout=60, what="the next term")
        lost = max(s.term for s in spans(log))
        rows = async_pair.standby.sql("SELECT max(term) FROM once_leases", database=name)
        assert rows[0][0] is None or rows[0][0] < lost
        failed_at = time.monotonic()
        async_pair.fail_over()
        wait_for(lambda: _terms_after(log, failed_at), timeout=90,
                 what="a leader on the promoted standby")
    finally:
        said = stop_leads(procs)
        async_pair.rebuild()
    later = _terms_after(log, failed_at)
    assert later and min(later) > lost and min(later) >= 1 << 32, (lost, later, said)


def test_a_synchronous_failover_leaves_no_two_children_alive(sync_pair: Pair,
                                                             tmp_path: Path) -> None:
    _, env, _ = _ledger(sync_pair, tmp_path)
    log = tmp_path / "children.log"
    procs = [_lead(env, log, "6s") for _ in range(3)]
    try:
        wait_for(lambda: spans(log), timeout=60, what="a leader's child")
        time.sleep(2)
        before = max(s.term for s in spans(log))
        failed_at = time.monotonic()
        sync_pair.fail_over()
        wait_for(lambda: [s for s in spans(log) if s.last > failed_at + 8], timeout=90,
                 what="a leader after the failover")
        time.sleep(2)
    finally:
        said = stop_leads(procs)
        sync_pair.rebuild()
    found = judge(log)
    assert max(s.term for s in found) >= before, said
