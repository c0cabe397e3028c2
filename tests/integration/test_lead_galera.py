"""`once lead` on a Galera cluster (tests/private_galera.py): candidates on three nodes race for
one lease, certification decides; the node under the leader killed, a candidate on another node
leads once the lease has run out; never two children alive at once (tests/lead_log.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import ONCE, run_once, wait_for
from lead_log import child, judge, spans, stop_leads
from private_galera import NODES, GaleraCluster

pytestmark = pytest.mark.slow


def _lead(url: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([ONCE, "lead", "--db", url, "--name", "beat", "--lease", "4s",
                             "--", *child(log)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_one_leader_across_three_nodes(galera: GaleraCluster, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    database = galera.new_database()
    assert run_once("schema", "--db", galera.url(1, database), env=env).returncode == 0
    log = tmp_path / "children.log"
    by_node = {node: [_lead(galera.url(node, database), env, log) for _ in range(2)]
               for node in NODES}
    procs = [proc for group in by_node.values() for proc in group]
    try:
        wait_for(lambda: spans(log), timeout=60, what="a leader's child")
        for _ in range(2):  # handovers by SIGTERM, across nodes
            leader = max(spans(log), key=lambda s: s.first)
            os.kill(leader.pid, signal.SIGTERM)
            wait_for(lambda term=leader.term: max(s.term for s in spans(log)) > term,
                     timeout=60, what="the next term")
        # The node under the leader killed: its child is stopped by the lease's deadline,
        # a candidate on another node leads.
        leader = max(spans(log), key=lambda s: s.first)
        node = next(n for n, group in by_node.items()
                    if any(_is_parent_of(p.pid, leader.pid) for p in group))
        killed_at = time.monotonic()
        galera.kill(node)
        wait_for(lambda: any(s.first > killed_at for s in spans(log)), timeout=90,
                 what="a leader on another node")
    finally:
        stop_leads(procs)
        galera.heal()
    found = judge(log)
    assert len(found) >= 4


def _is_parent_of(lead_pid: int, child_pid: int) -> bool:
    """The child runs under this `once lead` (its guard's child)."""
    from procs import parent

    try:
        return parent(parent(child_pid)) == lead_pid
    except AssertionError:
        return False
