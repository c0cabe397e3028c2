"""The leader scenario: `once lead` candidates of one name while their leaders are killed
(SIGKILL), their guards killed, stopped past the lease and woken, cut off from the ledger (a
relay that falls silent, on server backends) and terminated; candidates come back as they
exit. Judged from the children's own log (tests/lead_log.py): never two children alive at
once, terms strictly growing, and each fault's old child dead by its lease's deadline.
Failovers while leading are the tests' (tests/integration/test_lead_failover.py and
test_lead_galera.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

from common import ONCE, Backend, Config, Row, base_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lead_log import child, spans, stop_leads
from silent_relay import SilentRelay, tcp_upstream

LEASE = 3.0
FAULTS = ("kill", "kill-guard", "stop", "term", "silence")


def run(config: Config, backend: Backend, workdir: Path) -> list[Row]:
    workdir.mkdir(parents=True, exist_ok=True)
    url = backend.new_ledger()
    log = workdir / "children.log"
    row = Row("leader: kill, guard kill, stop, cut off, term")
    upstream = tcp_upstream(url)
    relays: dict[int, SilentRelay] = {}
    procs: list[subprocess.Popen[bytes]] = []
    env = base_env(url, workdir)

    def candidate() -> None:
        extra = []
        use = url
        if upstream is not None and config.rng.random() < 0.5:
            relay = SilentRelay(upstream)
            use = relay.url_for(url)
            extra.append(relay)
        with open(workdir / "lead.err", "ab") as err:
            proc = subprocess.Popen(
                [ONCE, "lead", "--name", "torture", "--lease", f"{LEASE:g}s",
                 *(["--rejoin"] if config.rng.random() < 0.5 else []), "--", *child(log)],
                env={**env, "ONCE_DATABASE_URL": use}, stderr=err)
        procs.append(proc)
        if extra:
            relays[proc.pid] = extra[0]

    for _ in range(4):
        candidate()
    rounds = config.count(12)
    try:
        for _ in range(rounds):
            leader, guard, kid = _wait_leader(procs, log)
            if leader is None:
                row.judge(["no leader within 30 s"], "a round")
                break
            fault = config.rng.choice([f for f in FAULTS if f != "silence" or
                                       leader.pid in relays])
            row.tried += 1
            began = time.monotonic()
            problems = _inflict(fault, leader, guard, relays)
            # The old child is dead by the lease's deadline (+ slack for a loaded machine).
            limit = began + LEASE + 2.0
            while _alive(kid) and time.monotonic() < limit:
                time.sleep(0.05)
            if _alive(kid):
                problems.append(f"{fault}: the old child {kid} outlived its lease")
            if fault == "stop":
                os.kill(leader.pid, signal.SIGCONT)
            if problems:
                row.fail("; ".join(problems))
            else:
                row.ok()
            for proc in list(procs):
                if proc.poll() is not None:
                    procs.remove(proc)
                    candidate()
    finally:
        stop_leads(procs)
        for relay in relays.values():
            relay.close()
    found = spans(log)
    overlap = 0.0
    for before, after in pairwise(found):
        if after.first <= before.last:
            overlap += before.last - after.first
            row.fail(f"terms {before.term} and {after.term} alive at once")
        if after.term <= before.term:
            row.fail(f"term {after.term} after term {before.term}")
    row.overlap = overlap
    row.note(f"{len(found)} terms, {rounds} faults")
    return [row]


def _inflict(fault: str, leader: subprocess.Popen[bytes], guard: int,
             relays: dict[int, SilentRelay]) -> list[str]:
    if fault == "kill":
        leader.kill()
        leader.wait()
    elif fault == "kill-guard":
        os.kill(guard, signal.SIGKILL)
    elif fault == "stop":
        os.kill(leader.pid, signal.SIGSTOP)
    elif fault == "term":
        leader.terminate()
    else:
        relays[leader.pid].silent.set()
    return []


def _wait_leader(procs: list[subprocess.Popen[bytes]], log: Path,
                 timeout: float = 30.0) -> tuple[subprocess.Popen[bytes] | None, int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                continue
            for guard in _children(proc.pid):
                for kid in _children(guard):
                    if any(s.pid == kid for s in spans(log)):
                        return proc, guard, kid
        time.sleep(0.05)
    return None, 0, 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(c) for c in children.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False
