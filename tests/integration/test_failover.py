"""Never twice through a PostgreSQL failover (docs/how-to/high-availability.md): real primaries with
real standbys (tests/replicas.py: Debian's binaries, loopback ports of their own, started once
a session), failed over by hand: the primary stopped as a crash would, the standby promoted.

- a synchronous standby, a fleet firing through a multi-host URL (target_session_attrs=
  read-write) or through haproxy (the standby as `backup`, which refuses writes until it is
  promoted): no period runs twice, fences grow across the failover, every result a caller
  was told is done is done on the new primary;
- an asynchronous standby whose WAL stream is paused and cut, so that it really lacks a claim
  when promoted: the old owner is fenced out at its next renewal, overlapping the new claim's
  command by less than a renewal interval, and the new claim's fence is larger;
- the lone synchronous standby down: a claim no standby confirms is released, not left to
  hold the period; reports read from a standby say so, and `once check` is UNKNOWN when it
  lags.

Without Debian's PostgreSQL binaries or socat (haproxy for its test) these skip, unless
ONCE_TEST_REPLICAS=required (CI), which makes them fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from child_log import day_key, stable_day
from helpers import run_once, wait_for
from procs import start_once
from replicas import REQUIRED, Haproxy, Pair, missing

pytestmark = pytest.mark.skipif(bool(missing()) and not REQUIRED, reason=missing() or "-")

# The command: holds its period's flock while it lives (and logs when it finds it taken: two
# attempts side by side), logs its start and end with its fence and the time, and prints its
# end for `once` to relay (so that each caller's output says what it ran).
WORK = r"""
exec 9>>"$DIR/$ONCE_PERIOD.lock"
if ! flock -n 9; then
    echo "overlap $ONCE_PERIOD $ONCE_FENCE $(date +%s.%N)" >> "$DIR/log"
    flock 9
    echo "clear $ONCE_PERIOD $ONCE_FENCE $(date +%s.%N)" >> "$DIR/log"
fi
echo "start $ONCE_PERIOD $ONCE_FENCE $(date +%s.%N)" >> "$DIR/log"
sleep "$WORK"
echo "end $ONCE_PERIOD $ONCE_FENCE $(date +%s.%N)" >> "$DIR/log"
echo "end $ONCE_PERIOD $ONCE_FENCE"
"""


@pytest.fixture(scope="session")
def sync_pair() -> Iterator[Pair]:
    pair = Pair("sync", sync=True)
    yield pair
    pair.destroy()


@pytest.fixture(scope="session")
def async_pair() -> Iterator[Pair]:
    pair = Pair("async", sync=False, relayed=True)
    yield pair
    pair.destroy()


class Ledger:
    """A database of this test's own on a pair, its tables made, and what its commands logged."""

    def __init__(self, pair: Pair, tmp_path: Path) -> None:
        self.pair, self.dir = pair, tmp_path
        self.name = "once_f_" + uuid.uuid4().hex[:12]
        pair.primary.sql(f"CREATE DATABASE {self.name}")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
        self.env.update(XDG_STATE_HOME=str(tmp_path / "state"), DIR=str(tmp_path), WORK="2")
        made = run_once("schema", "--db", pair.primary.url(self.name), env=self.env)
        assert made.returncode == 0, made.stderr
        pair.caught_up()

    def rows(self, job: str, node: Any = None) -> dict[str, tuple[Any, ...]]:
        """The job's period -> (status, attempt, fence), as the primary (or node) holds it."""
        node = node or self.pair.primary
        return {p: (s, a, f) for p, s, a, f in node.sql(
            "SELECT period, status, attempt, fence FROM once_runs WHERE job = %s", (job,),
            database=self.name)}

    def log(self) -> list[tuple[str, str, int, float]]:
        """(what, period, fence, when) of every line the commands logged."""
        path = self.dir / "log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(w, p, int(f), float(t)) for w, p, f, t in (line.split() for line in lines)]

    def drop(self) -> None:
        try:
            self.pair.primary.sql(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        except Exception as exc:  # leftovers are harmless: every test has its own name
            print(f"warning: could not drop {self.name}: {exc}")


def _run(ledger: Ledger, url: str, job: str, *args: str, work: str = "0",
         command: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return run_once("run", "--job", job, "--every", "day", "--stale-after", "10s", *args,
                    "--", *(command or ("sh", "-c", WORK)), env={**ledger.env, "WORK": work,
                                                                 "ONCE_DATABASE_URL": url},
                    timeout=120)


class Fleet:
    """`once run` fired as cron fires it on a fleet: a new process every `tick` seconds (while
    fewer than `most` are alive: the test machine's cores are few), for the past days that
    have come due in turn (lag k from k * `spacing` seconds on), until the ledger holds each
    done."""

    def __init__(self, ledger: Ledger, url: str, lags: range, tick: float = 0.5,
                 spacing: float = 1.0, most: int = 6) -> None:
        self.ledger, self.url, self.lags = ledger, url, lags
        self.tick, self.spacing, self.most = tick, spacing, most
        self.keys = {lag: day_key(lag) for lag in lags}
        self.done: set[str] = set()
        self.procs: list[subprocess.Popen[str]] = []
        self.results: list[tuple[int, str, str]] = []  # (status, stdout, stderr)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fire, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _fire(self) -> None:
        began, turn, looked = time.monotonic(), 0, 0.0
        env = {**self.ledger.env, "ONCE_DATABASE_URL": self.url}
        while not self._stop.is_set():
            now = time.monotonic()
            if now - looked > 1.0:
                looked = now
                self._look()
            due = [lag for lag in self.lags if now - began >= (lag - self.lags[0]) * self.spacing
                   and self.keys[lag] not in self.done]
            if not due and len(self.done) == len(self.lags):
                return
            if due and sum(1 for p in self.procs if p.poll() is None) < self.most:
                lag = due[turn % len(due)]
                turn += 1
                self.procs.append(start_once(
                    "run", "-v", "--job", "fleet", "--every", "day", "--lag", str(lag),
                    "--stale-after", "15s", "--", "sh", "-c", WORK, env=env))
            self._stop.wait(self.tick)

    def _look(self) -> None:
        """Which periods the ledger holds done (nothing, while no primary answers)."""
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                self.done |= {p for (p,) in conn.execute(
                    "SELECT period FROM once_runs WHERE status = 'done'")}
        except psycopg.Error:
            pass

    def finish(self, timeout: float = 180) -> None:
        """Wait until every period is done and every caller has ended."""
        self._thread.join(timeout)
        alive = self._thread.is_alive()
        self._stop.set()
        self._thread.join()
        for proc in self.procs:
            out, err = proc.communicate(timeout=120)
            self.results.append((proc.returncode, out, err))
        assert not alive, f"the fleet did not converge: done {sorted(self.done)}"

    def stop(self) -> None:
        """Stop firing, and end every caller still running (a test that failed early)."""
        self._stop.set()
        self._thread.join()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _mid_run(ledger: Ledger, ended: int) -> bool:
    """A command is 0.5 to 1.5 s into its 2 s of work (its result will meet the failover), and
    at least `ended` commands have ended."""
    log = ledger.log()
    if sum(1 for what, *_ in log if what == "end") < ended:
        return False
    finished = {(p, f) for what, p, f, _ in log if what == "end"}
    now = time.time()
    return any(what == "start" and (p, f) not in finished and 0.5 <= now - t <= 1.5
               for what, p, f, t in log)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["multi-host", "haproxy"])
def test_a_synchronous_failover_runs_no_period_twice(sync_pair: Pair, tmp_path: Path,
                                                     route: str) -> None:
    if route == "haproxy" and shutil.which("haproxy") is None and not REQUIRED:
        pytest.skip("haproxy is not installed")
    stable_day()
    ledger = Ledger(sync_pair, tmp_path)
    proxy = Haproxy(sync_pair) if route == "haproxy" else None
    url = proxy.url(ledger.name) if proxy else sync_pair.multi_host_url(ledger.name)
    fleet = Fleet(ledger, url, range(1, 7))
    try:
        fleet.start()
        wait_for(lambda: _mid_run(ledger, ended=2), timeout=120, what="a command mid-run")
        crashed = time.time()
        sync_pair.crash_primary()
        met = ""
        if proxy is not None:  # haproxy sends what comes now to the standby, which refuses
            met = wait_for(lambda: _refused_write(_run(ledger, url, "probe").stderr),
                           timeout=60, what="a claim through haproxy to meet the standby")
        # The failover manager decides (Patroni takes its ttl): meanwhile, no primary.
        time.sleep(max(0.0, crashed + 2.5 - time.time()))
        sync_pair.promote_standby()
        promoted = time.time()
        fleet.finish()
        _no_period_twice(ledger, fleet, crashed, promoted)
        assert proxy is None or "the server is a standby" in met, met  # said as one
    finally:
        if proxy is not None:
            proxy.stop()
        fleet.stop()
        sync_pair.rebuild()
        ledger.drop()


def _refused_write(stderr: str) -> str:
    return stderr if "read-only transaction" in stderr else ""


def _exits(fleet: Fleet) -> dict[int, int]:
    counts: dict[int, int] = {}
    for status, _, _ in fleet.results:
        counts[status] = counts.get(status, 0) + 1
    return counts


def _no_period_twice(ledger: Ledger, fleet: Fleet, crashed: float, promoted: float) -> None:
    log = ledger.log()
    exits = _exits(fleet)
    assert not [line for line in log if line[0] == "overlap"], (log, exits)
    ends: dict[str, list[int]] = {}
    for what, period, fence, _ in log:
        if what == "end":
            ends.setdefault(period, []).append(fence)
    assert {p: len(f) for p, f in ends.items()} == {key: 1 for key in fleet.keys.values()}, (
        f"work finished twice or never: {ends}; exits {exits}")
    # Every caller told its period was done (exit 0, its command's end relayed): done on the
    # new primary, by the claim whose fence its command saw.
    rows = ledger.rows("fleet")
    told = [out.split() for status, out, _ in fleet.results if status == 0 and out]
    for _, period, fence in told:
        assert rows[period][0] == "done" and rows[period][2] == int(fence), (period, rows)
    assert len(told) == len(fleet.keys), (told, exits)
    # Fences: none handed out twice, and every one after the failover above every one before.
    starts = [(fence, when) for what, _, fence, when in log if what == "start"]
    assert len({f for f, _ in starts}) == len(starts), starts
    before = [f for f, when in starts if when < crashed]
    after = [f for f, when in starts if when > promoted]
    assert before and after, (starts, crashed, promoted)
    assert max(before) < min(after), (before, after)
    assert min(after) >= 1 << 32  # the new timeline's (2): above any fence of timeline 1


@pytest.mark.slow
def test_an_asynchronous_failover_fences_the_owner_of_a_lost_claim_out(
        async_pair: Pair, tmp_path: Path) -> None:
    stable_day()
    ledger = Ledger(async_pair, tmp_path)
    url = async_pair.multi_host_url(ledger.name)
    env = {**ledger.env, "ONCE_DATABASE_URL": url}
    stale_after = 9.0
    args = ("run", "--job", "j", "--every", "day", "--stale-after", f"{stale_after:g}s", "--",
            "sh", "-c", WORK)
    try:
        assert run_once("run", "--job", "warm", "--every", "day", "--", "true",
                        env=env).returncode == 0
        async_pair.caught_up()
        assert async_pair.relay is not None
        async_pair.relay.pause()  # from here on the standby receives nothing
        owner = start_once(*args, env={**env, "WORK": "60"})
        wait_for(lambda: any(w == "start" for w, *_ in ledger.log()), what="the command")
        lost_fence = ledger.log()[0][2]
        # The claim really is lost: committed on the primary, absent from the standby.
        assert day_key(0) in ledger.rows("j")
        assert day_key(0) not in ledger.rows("j", async_pair.standby)
        async_pair.fail_over()
        second = start_once(*args, env={**env, "WORK": "2"})
        _, owner_err = owner.communicate(timeout=60)
        out, err = second.communicate(timeout=60)
    finally:
        async_pair.rebuild()
    assert owner.returncode == 70, owner_err
    assert "this claim" in owner_err and "another attempt took it over" not in owner_err
    assert second.returncode == 0, err
    log = ledger.log()
    assert [w for w, *_ in log if w == "end"] == ["end"]  # the second's only
    new_fence = int(out.split()[2])
    assert new_fence > lost_fence and new_fence >= 1 << 32, (lost_fence, new_fence)
    assert ledger.rows("j")[day_key(0)] == ("done", 1, new_fence)
    # The two commands overlapped for less than one renewal interval (the old owner's next
    # renewal found the row was not its claim's), measured by the kernel's flock.
    overlap = [t for w, _, f, t in log if w == "overlap" and f == new_fence]
    clear = [t for w, _, f, t in log if w == "clear" and f == new_fence]
    if overlap:
        assert clear[0] - overlap[0] < stale_after / 3 + 1.0, log
    ledger.drop()


@pytest.mark.slow
def test_a_claim_no_synchronous_standby_confirms_is_released(sync_pair: Pair,
                                                             tmp_path: Path) -> None:
    stable_day()
    ledger = Ledger(sync_pair, tmp_path)
    url = sync_pair.primary.url(ledger.name)
    ran = ("sh", "-c", "echo ran")
    assert _run(ledger, url, "failing", command=("false",)).returncode == 1
    assert _run(ledger, url, "out", "--max-attempts", "1", command=("false",)).returncode == 1
    assert _run(ledger, url, "dead", command=("true",)).returncode == 0
    for table in ("once_runs", "once_attempts"):  # as if its owner had died while running
        sync_pair.primary.sql(f"UPDATE {table} SET status = 'running', finished_at = NULL"
                              + (", heartbeat_at = now() - interval '1 hour'"
                                 if table == "once_runs" else ", outcome = NULL")
                              + " WHERE job = 'dead'", database=ledger.name)
    sync_pair.standby.stop("fast")  # the only synchronous standby
    try:
        began = time.monotonic()
        refused = [_run(ledger, url, "fresh", command=ran)]
        took = time.monotonic() - began
        refused += [_run(ledger, url, job, command=ran) for job in ("failing", "dead")]
        refused.append(run_once("rerun", "--job", "out", "--period", day_key(0), "--", *ran,
                                env={**ledger.env, "ONCE_DATABASE_URL": url}))
        rows = ledger.pair.primary.sql(
            "SELECT job, status, attempt, stale_after FROM once_runs ORDER BY job",
            database=ledger.name)
    finally:
        sync_pair.standby.start()
        sync_pair.streaming()
    for claim in refused:
        assert claim.returncode == 75, claim.stderr
        assert "no synchronous standby confirmed the claim" in claim.stderr
        assert "so it was released" in claim.stderr and "ran" not in claim.stdout
    assert took < 30  # the statement's cancel (5 s with --stale-after 10s), not for ever
    # Nothing holds a period: the first claim is gone, a takeover of a failure (a retry, a
    # rerun) put back what it took over, the takeover of a dead owner's row left stale.
    assert [row[:3] for row in rows] == [("dead", "running", 2), ("failing", "failed", 1),
                                         ("out", "failed", 1)], rows
    assert rows[0][3] == 0.0
    # With the standby back, the next fire of each runs it at once (nothing waits for
    # --stale-after), but for the period that failed out, which takes a rerun.
    for job, attempt in (("fresh", 1), ("failing", 2), ("dead", 3)):
        again = _run(ledger, url, job, "-v", command=ran)
        assert again.returncode == 0 and again.stdout == "ran\n", again.stderr
        assert f"as attempt {attempt}," in again.stderr
    out = _run(ledger, url, "out", "-v", "--max-attempts", "1", command=ran)
    assert out.returncode == 0 and out.stdout == "" and "no attempts left" in out.stderr
    ledger.drop()


@pytest.mark.slow
def test_reports_read_from_a_standby_say_so(sync_pair: Pair, tmp_path: Path) -> None:
    ledger = Ledger(sync_pair, tmp_path)
    primary, standby = (node.url(ledger.name) for node in (sync_pair.primary, sync_pair.standby))
    env = ledger.env
    assert _run(ledger, primary, "good", command=("true",)).returncode == 0
    sync_pair.caught_up()
    # A claim sent to a standby says that it is one.
    refused = _run(ledger, standby, "good", "--lag", "1", command=("true",))
    assert refused.returncode == 75
    assert "the server is a standby" in refused.stderr, refused.stderr
    assert "target_session_attrs=read-write" in refused.stderr
    checked = run_once("check", "--db", standby, env=env)
    assert checked.returncode == 0 and "(a standby, 0.0s behind its primary)" in checked.stdout
    sync_pair.standby.sql("SELECT pg_wal_replay_pause()")
    try:
        assert _run(ledger, primary, "bad", "--max-attempts", "1",
                    command=("false",)).returncode == 1  # failed out: CRITICAL, due or not
        wait_for(lambda: sync_pair.standby.scalar(
            "SELECT clock_timestamp() - pg_last_xact_replay_timestamp() > '1.5s'"),
            what="the standby to lag")
        lagging = run_once("check", "--db", standby, "--grace", "1s", env=env)
        status = run_once("status", "--db", standby, env=env)
        as_json = run_once("status", "--json", "--db", standby, env=env)
    finally:
        sync_pair.standby.sql("SELECT pg_wal_replay_resume()")
    assert lagging.returncode == 3, lagging.stdout
    assert lagging.stdout.startswith("UNKNOWN - - standby (the ledger "), lagging.stdout
    assert "a standby" in status.stdout and "behind its primary" in status.stdout
    assert json.loads(as_json.stdout)[0]["standby"]["replay_lag_s"] > 1
    # Caught up again: the failure the primary holds is there, and nothing is UNKNOWN.
    sync_pair.caught_up()
    caught_up = run_once("check", "--db", standby, env=env)
    assert caught_up.returncode == 2 and "CRITICAL bad " in caught_up.stdout, caught_up.stdout
    assert "UNKNOWN" not in caught_up.stdout
    # The primary's own reports say nothing of standbys.
    assert "standby" not in run_once("check", "--db", primary, env=env).stdout
    assert json.loads(run_once("status", "--json", "--db", primary,
                               env=env).stdout)[0]["standby"] is None
    ledger.drop()



# -- once doctor and the bounds of every wait (issue 34) ----------------------------------------


def _doctor(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_once("doctor", "--db", url, env=env, timeout=120)


def _waiting(node: Any) -> list[Any]:
    """The server's sessions that wait for a synchronous standby or for a lock."""
    return node.sql("SELECT pid, wait_event, left(query, 60) FROM pg_stat_activity "
                    "WHERE wait_event = 'SyncRep' OR wait_event_type = 'Lock'")


@pytest.mark.slow
def test_the_only_synchronous_standby_down_doctor_says_so_and_no_wait_is_unbounded(
        sync_pair: Pair, tmp_path: Path) -> None:
    ledger = Ledger(sync_pair, tmp_path)
    url = sync_pair.primary.url(ledger.name)
    for lag in ("1", "0"):  # two done periods: the older one is the prune's
        assert _run(ledger, url, "old", "--lag", lag, command=("true",)).returncode == 0
    for table in ("once_runs", "once_attempts"):
        sync_pair.primary.sql(f"UPDATE {table} SET finished_at = finished_at - interval '2 days'"
                              f" WHERE job = 'old'", database=ledger.name)
    fresh = "once_f_" + uuid.uuid4().hex[:12]  # no tables yet: the first use creates them
    sync_pair.primary.sql(f"CREATE DATABASE {fresh}")
    fresh_url = sync_pair.primary.url(fresh)
    env = {**ledger.env, "ONCE_DATABASE_URL": fresh_url}
    ran = ("sh", "-c", "echo ran")
    sync_pair.standby.stop("fast")  # the only synchronous standby
    try:
        doctor = _doctor(url, ledger.env)
        began = time.monotonic()
        first_uses = [start_once("run", "--job", "j", "--every", "day", "--stale-after", "10s",
                                 "--", *ran, env=env) for _ in range(2)]
        ends = [p.communicate(timeout=120) for p in first_uses]
        took = time.monotonic() - began
        began = time.monotonic()
        pruned = run_once("prune", "--db", url, "--older-than", "1d", env=ledger.env,
                          timeout=120)
        prune_took = time.monotonic() - began
        left_waiting = _waiting(sync_pair.primary)
    finally:
        sync_pair.standby.start()
        sync_pair.streaming()
    # doctor said "OK replication no standby attached", exit 0 but for the pair's fsync.
    assert ("CRITICAL replication synchronous_standby_names = '*' waits for 1 synchronous "
            "standby(s), 0 connected: no claim can commit") in doctor.stdout, doctor.stdout
    # The first use's commit waited for ever, and the second behind its schema lock: each
    # now ends with exit 75 and its line, nothing run.
    assert [p.returncode for p in first_uses] == [75, 75], ends
    assert all("ran" not in out for out, _ in ends)
    errors = "".join(err for _, err in ends)
    assert ("cannot create the ledger's tables in " in errors and "no synchronous standby "
            "confirmed them within 15s (is the synchronous standby down? see "
            "synchronous_standby_names); nothing was run" in errors), errors
    assert took < 60, took  # 15 s for the first; the second's lock, then its claim's 5 s
    assert pruned.returncode == 75, pruned.stdout + pruned.stderr
    assert "stands on the primary alone: no synchronous standby confirmed it within 15s" \
        in pruned.stderr, pruned.stderr
    assert prune_took < 40, prune_took
    assert left_waiting == [], left_waiting  # no commit, no lock left behind
    # With the standby back, the ledger made on the primary alone serves the next fire.
    again = run_once("run", "--job", "j", "--every", "day", "--", *ran, env=env)
    assert again.returncode == 0 and again.stdout == "ran\n", again.stderr
    assert "CRITICAL replication" not in _doctor(url, ledger.env).stdout
    sync_pair.primary.sql(f"DROP DATABASE IF EXISTS {fresh} WITH (FORCE)")
    ledger.drop()


@pytest.mark.slow
def test_doctor_on_a_caught_up_standby_says_it_is_not_behind(sync_pair: Pair,
                                                              tmp_path: Path) -> None:
    # doctor timed a standby by the age of the last commit it replayed ("2s behind", then
    # "6s"), where the reports say 0 while it has replayed all it received: one rule now.
    ledger = Ledger(sync_pair, tmp_path)
    assert _run(ledger, sync_pair.primary.url(ledger.name), "j",
                command=("true",)).returncode == 0
    sync_pair.caught_up()
    wait_for(lambda: sync_pair.standby.scalar(
        "SELECT clock_timestamp() - pg_last_xact_replay_timestamp() > '2s'"),
        what="the last replayed commit to be 2 s old")
    standby = sync_pair.standby.url(ledger.name)
    doctor = _doctor(standby, ledger.env)
    assert "CRITICAL session the server is a standby (in recovery, 0s behind its primary)" \
        in doctor.stdout, doctor.stdout
    checked = run_once("check", "--db", standby, env=ledger.env)
    assert "(a standby, 0.0s behind its primary)" in checked.stdout, checked.stdout
    ledger.drop()


@pytest.mark.slow
def test_doctor_reads_every_host_of_a_host_list(sync_pair: Pair, async_pair: Pair,
                                                tmp_path: Path) -> None:
    # doctor read the first host alone: a list of two independent primaries was OK, and
    # with the first stopped, the day ran again on the second.
    ledger = Ledger(sync_pair, tmp_path)
    async_pair.primary.sql(f"CREATE DATABASE {ledger.name}")
    try:
        ports = (sync_pair.primary.port, async_pair.primary.port)
        two = _doctor(f"postgresql://postgres@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/"
                      f"{ledger.name}", ledger.env)
        assert "CRITICAL hosts the URL's hosts are separate servers, not one cluster " \
               f"(127.0.0.1:{ports[0]}: system_identifier " in two.stdout, two.stdout
        assert two.returncode == 2
        one = _doctor(sync_pair.multi_host_url(ledger.name), ledger.env)
        assert "OK hosts 2 hosts, one cluster (system_identifier " in one.stdout, one.stdout
        assert "1 primary, the rest its standbys" in one.stdout
        idle = _doctor_with_the_standby_detached(sync_pair, ledger)
        assert f"WARNING hosts 127.0.0.1:{sync_pair.standby.port}: a standby that streams " \
               "from no server" in idle.stdout, idle.stdout
    finally:
        async_pair.primary.sql(f"DROP DATABASE IF EXISTS {ledger.name} WITH (FORCE)")
    ledger.drop()


def _doctor_with_the_standby_detached(pair: Pair, ledger: Ledger
                                      ) -> subprocess.CompletedProcess[str]:
    """once doctor on the pair's host list while its standby streams from nowhere (no
    primary_conninfo: no WAL receiver), then the standby streaming again."""
    from psycopg import sql

    conninfo = pair.standby.scalar("SHOW primary_conninfo")
    pair.standby.sql("ALTER SYSTEM SET primary_conninfo = ''")
    try:
        pair.standby.sql("SELECT pg_reload_conf()")
        wait_for(lambda: pair.standby.scalar("SELECT count(*) FROM pg_stat_wal_receiver") == 0,
                 timeout=60, what="the standby's WAL receiver to stop")
        return _doctor(pair.multi_host_url(ledger.name), ledger.env)
    finally:
        with psycopg.connect(pair.standby.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET primary_conninfo = {}").format(
                sql.Literal(conninfo)))
            conn.execute("SELECT pg_reload_conf()")
        pair.streaming()


@pytest.mark.slow
def test_a_first_use_behind_a_schema_lock_that_is_never_let_go_ends(sync_pair: Pair,
                                                                   tmp_path: Path) -> None:
    # Another process holds the schema lock and never lets it go (an older once stuck in a
    # commit, a session left open): a first use waited for ever; now 60 s (schema.LOCK_WAIT).
    fresh = "once_f_" + uuid.uuid4().hex[:12]  # a database of its own: its own advisory locks
    sync_pair.primary.sql(f"CREATE DATABASE {fresh}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"))
    try:
        with psycopg.connect(sync_pair.primary.url(fresh)) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(7310504102)")  # the schema lock
            began = time.monotonic()
            made = run_once("schema", "--db", sync_pair.primary.url(fresh), env=env,
                            timeout=180)
            took = time.monotonic() - began
            holder.rollback()
    finally:
        sync_pair.primary.sql(f"DROP DATABASE IF EXISTS {fresh} WITH (FORCE)")
    assert made.returncode == 75, made.stdout + made.stderr
    assert "cannot create the ledger's tables in " in made.stderr
    assert "lock timeout" in made.stderr, made.stderr
    assert 55 < took < 120, took
