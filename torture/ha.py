"""Scenario 8: high availability. A storm (storm.py) of cron-like fires of real `once` works
through the periods of one job on a ledger of its own HA servers, started on loopback for
the scenario and stopped at its end (however it ends), while the servers fail under it and
owners are killed, stopped and terminated (the owner faults) at random moments.

- PostgreSQL: a primary and a synchronous standby (tests/replicas.py: Debian's binaries,
  `synchronous_standby_names = '*'`), every caller through one multi-host URL naming both
  (`target_session_attrs=read-write`). Every few seconds the primary crashes (`pg_ctl stop
  -m immediate`), the standby is promoted after a pause a failover manager would take, and
  a fresh standby is built from the new primary on the old one's port (`pg_basebackup`), so
  that the URL names the pair through every failover and the next one is synchronous again.
- MariaDB: a three-node Galera cluster (tests/private_galera.py), the callers spread across
  the nodes: a URL naming one node, or all three in a rotated order. Every few seconds a
  node is killed (SIGKILL) and, after a pause, started again empty: it rejoins by a state
  transfer (rsync) from another node.
- SQLite: not applicable (no standby, no cluster).

The verdict is the storms' (verdict.py: overlap, twice, never done; a period whose result a
failover kept from being recorded in time is "redone", as docs/how-to/high-availability.md
says), plus a row for the fences: every claim whose command started is in the ledger after the
failovers (a synchronous standby and Galera's certification lose no acknowledged commit), no
fence names two claims, and per job fences grow strictly with the claims' start (one host's
clock). The storm does not end before a number of failovers or node kills has been made. An
asynchronous standby, which loses commits by design (overlap bounded by one renewal
interval), is left to tests/integration/test_failover.py.
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from common import CHILD, Backend, Config, Mark, Proc, Row, db_time, histogram, not_applicable
from storm import Background, Fault, OwnerFaults, Spec, Storm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import private_galera  # the Galera cluster of the suite's tests
import replicas  # the PostgreSQL pairs of the suite's failover tests

JOB = "ha"


class Failovers(Background):
    """The primary crashes; after a pause its synchronous standby is promoted; a new standby
    is built from it on the old primary's port, synchronous once it streams."""

    def __init__(self, rng: random.Random, pair: replicas.Pair, every: tuple[float, float],
                 down: tuple[float, float]) -> None:
        super().__init__(rng, every)
        self.pair, self.down = pair, down
        self.made = 0
        self.rebuilds: list[float] = []

    def make(self, storm: Storm) -> None:
        pair = self.pair
        if not pair.standby.up:  # a rebuild that failed: the pair is made whole first
            pair.rebuild(same_port=True)
            return
        t0 = time.time()
        pair.crash_primary()
        pause = self.rng.uniform(*self.down)
        time.sleep(pause)  # the failover manager decides: meanwhile, no primary
        pair.promote_standby()
        t1 = time.time()
        timeline = int(pair.primary.scalar(
            "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"), 16)
        storm.injector.add(Fault("failover", t0, t1, db=True,
                                 detail=f"no primary for {t1 - t0:.1f}s, timeline {timeline}"))
        self.made += 1
        pair.rebuild(same_port=True)
        self.rebuilds.append(time.time() - t1)

    def finish(self, storm: Storm) -> None:
        super().finish(storm)
        if not self.pair.primary.up:
            self.pair.promote_standby()


class NodeKills(Background):
    """A Galera node killed (SIGKILL), then started again empty after a pause: it rejoins the
    cluster by a state transfer."""

    def __init__(self, rng: random.Random, cluster: private_galera.GaleraCluster,
                 every: tuple[float, float], down: tuple[float, float]) -> None:
        super().__init__(rng, every)
        self.cluster, self.down = cluster, down
        self.made = 0
        self.dead: int | None = None
        self.rebuilds: list[float] = []

    def make(self, storm: Storm) -> None:
        node = self.rng.choice(private_galera.NODES)
        t0 = time.time()
        self.dead = node
        self.cluster.kill(node)
        pause = self.rng.uniform(*self.down)
        time.sleep(pause)
        t1 = time.time()
        self.cluster.heal()  # the node rejoins: until then, two nodes of three
        self.dead = None
        self.rebuilds.append(time.time() - t1)
        storm.injector.add(Fault("node kill", t0, time.time(), db=True,
                                 detail=f"node {node} down {pause:.1f}s, rejoined in "
                                        f"{time.time() - t1:.1f}s"))
        self.made += 1

    def finish(self, storm: Storm) -> None:
        super().finish(storm)
        self.dead = None
        self.cluster.heal()


class HaFaults(OwnerFaults):
    """The owner faults (SIGKILL, SIGSTOP past --stale-after, SIGTERM of owners whose command
    runs) on the storm's tick, and the servers' faults on a thread of their own."""

    def __init__(self, rng: random.Random, servers: Failovers | NodeKills) -> None:
        super().__init__(rng, every=(0.6, 1.5))
        self.servers = servers

    def tick(self, storm: Storm, now: float) -> None:
        self.servers.tick(storm, now)
        super().tick(storm, now)

    def finish(self, storm: Storm) -> None:
        super().finish(storm)
        self.servers.finish(storm)


class HaStorm(Storm):
    """The storm's fires, each through a route of its own (a URL), and not over before the
    servers have failed `least` times."""

    def __init__(self, config: Config, backend: Backend, url: str, outdir: Path, spec: Spec,
                 injector: HaFaults, routes: Callable[[random.Random], tuple[str, str]],
                 reader: Callable[[], str], least: int) -> None:
        super().__init__(config, backend, url, outdir, spec, injector)
        self.routes, self.reader, self.least = routes, reader, least
        self.servers = injector.servers
        self.verdict_marks: list[Mark] = []  # the children's lines, as the verdict read them

    def fire(self) -> None:
        route, url = self.routes(self.rng)
        proc = Proc([*self.spec.prefix, *self.argv(), "--", *CHILD],
                    {**self.env, "ONCE_DATABASE_URL": url}, self.outdir, route)
        self.procs.append(proc)
        self.by_pid[proc.pid] = proc

    def done_in_ledger(self) -> bool:
        if self.servers.made < self.least:
            return False
        self.url = self.reader()  # a node that is up
        return super().done_in_ledger()


def _fences_row(storm: HaStorm, what: str) -> Row:
    """Every claim: in the ledger if its command started, its fence its own, larger than
    every fence claimed before it (by started_at, the servers share one clock)."""
    row = Row(f"{what}: every claim kept, fences strictly increasing, none reused")
    rows = storm.backend.query(storm.url, "SELECT period, attempt, fence, started_at FROM "
                                          "once_attempts WHERE job = %s", (JOB,))
    claims = sorted((db_time(at), int(fence), period, int(attempt))
                    for period, attempt, fence, at in rows)
    uses = Counter(fence for _, fence, _, _ in claims)
    kept = {(period, fence) for _, fence, period, _ in claims}
    before, top, last_at = 0, 0, None  # the largest fence of the claims strictly earlier
    for at, fence, period, attempt in claims:
        if at != last_at:
            before, last_at = top, at
        top = max(top, fence)
        problems = []
        if uses[fence] > 1:
            problems.append(f"fence {fence} names {uses[fence]} claims")
        if fence <= before:
            problems.append(f"fence {fence} claimed after fence {before}")
        row.judge(problems, f"{period} attempt {attempt} fence {fence}")
    started: dict[int, set[str]] = {}
    for mark in storm.verdict_marks:
        if mark.word == "start":
            started.setdefault(mark.fence, set()).add(mark.period)
    for fence, periods in sorted(started.items()):
        problems = [f"the command of {p} fence {fence} ran, but its claim is not in the "
                    f"ledger (lost in a failover)" for p in sorted(periods)
                    if (p, fence) not in kept]
        if len(periods) > 1:
            problems.append(f"fence {fence} ran commands of {len(periods)} periods")
        if problems:
            row.judge(problems, f"fence {fence}")
    big = [f for _, f, _, _ in claims if f >= 1 << 32]
    row.note(f"{len(claims)} claims, fences {min(uses, default=0)} to {top}"
             + (f" ({len(big)} from 2^32 on: on a later timeline)" if big else ""))
    return row


def _judge(storm: HaStorm, title: str, what: str, labels: dict[str, str]) -> list[Row]:
    verdict = storm.verdict()
    storm.verdict_marks = verdict.marks
    rows: dict[str, Row] = {}
    verdict.judge_faults(rows, lambda kind: labels.get(kind, kind))
    kind = next(iter(labels))  # the servers' fault
    hit = [key for f in storm.injector.faults if f.kind == kind for key in verdict.touched(f)]
    if kind in rows:
        fenced = sum(1 for p in storm.procs if p.returncode == 70)
        rows[kind].note(f"{len(hit)} periods with a command running across one, "
                        f"{len(set(hit))} different; {fenced} owners fenced out (exit 70)")
    periods = verdict.periods_row(title)
    servers = storm.servers
    if servers.made < storm.least:
        periods.fail(f"only {servers.made} {what} made, of the {storm.least} the storm waits "
                     f"for ({'; '.join(servers.errors[:3]) or 'no error'})")
    if servers.errors:
        periods.note(f"the fault itself failed {len(servers.errors)} times: "
                     f"{servers.errors[0]}")
    if servers.rebuilds:
        periods.note(f"{what}: {servers.made}, the server back in "
                     f"{min(servers.rebuilds):.1f}-{max(servers.rebuilds):.1f}s")
    periods.note(f"routes: {histogram([p.tag for p in storm.procs])}")
    return [*(rows.get(k) or Row(name) for k, name in labels.items()), periods,
            _fences_row(storm, what)]


OWNER_LABELS = {"SIGKILL": "owner SIGKILL, command running",
                "SIGSTOP": "owner SIGSTOP past --stale-after, SIGCONT",
                "SIGTERM": "owner SIGTERM, command running"}


def _spec(config: Config) -> Spec:
    # --stale-after 6s: renewals every 2 s, and a failover that is over within 4 s of the
    # last one changes nothing for the owner; a longer one fences it out.
    # Work up to 12 s, so that owners can be stopped past --stale-after mid-command.
    return Spec(job=JOB, periods=config.count(120, 12), stale=6.0, work=(1.0, 12.0),
                max_live=12, limit=config.span(360, 180))


def _postgres(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    title = "PostgreSQL primary crashed (stop -m immediate), synchronous standby promoted"
    why = replicas.missing()
    if why:
        return [not_applicable(title, why)]
    rng = random.Random(config.rng.random())
    pair = replicas.Pair("torture-ha", sync=True)
    try:
        database = "torture_ha_" + uuid.uuid4().hex[:10]
        pair.primary.sql(f"CREATE DATABASE {database}")
        pair.caught_up()
        url = pair.multi_host_url(database)
        servers = Failovers(rng, pair, every=(2.0, 6.0), down=(0.5, 4.0))
        spec = _spec(config)
        storm = HaStorm(config, backend, url, outdir, spec, HaFaults(rng, servers),
                        lambda _rng: ("multi-host", url), lambda: url,
                        least=config.count(10, 2))
        storm.blow()
        return _judge(storm, f"PostgreSQL failovers: {spec.periods} periods converge, each "
                             f"finished once (or redone as documented)", "failovers",
                      {"failover": title, **OWNER_LABELS})
    finally:
        pair.destroy()


def _cluster(title: str) -> private_galera.GaleraCluster | Row:
    """The Galera cluster (on a block of ports of its own: another run's cluster may hold
    others); a row saying why not, when it cannot run here (its programs are missing). No
    block of ports free fails the run, as a taken port did."""
    try:
        return private_galera.GaleraCluster()
    except RuntimeError as exc:
        if "no block of ports" in str(exc):
            raise
        return not_applicable(title, str(exc))


def _galera(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    title = "Galera node killed (SIGKILL), rejoined by state transfer"
    cluster = _cluster(title)
    if isinstance(cluster, Row):
        return [cluster]
    rng = random.Random(config.rng.random())
    try:
        cluster.start()
        database = cluster.new_database()
        nodes = private_galera.NODES
        servers = NodeKills(rng, cluster, every=(3.0, 8.0), down=(0.5, 4.0))

        def route(pick: random.Random) -> tuple[str, str]:
            if pick.random() < 0.3:
                node = pick.choice(nodes)
                return f"node{node}", cluster.url(node, database)
            first = pick.randrange(len(nodes))
            order = [nodes[(first + i) % len(nodes)] for i in range(len(nodes))]
            return "host list", cluster.hosts_url(order, database)

        def reader() -> str:
            return cluster.url(next(n for n in nodes if n != servers.dead), database)

        spec = _spec(config)
        storm = HaStorm(config, backend, cluster.url(1, database), outdir, spec,
                        HaFaults(rng, servers), route, reader, least=config.count(10, 2))
        storm.blow()
        storm.url = reader()
        return _judge(storm, f"Galera node kills: {spec.periods} periods converge, each "
                             f"finished once (or redone as documented)", "node kills",
                      {"node kill": title, **OWNER_LABELS})
    finally:
        cluster.stop()


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    outdir = outdir / "ha"
    if backend.name == "postgresql":
        return _postgres(config, backend, outdir)
    if backend.name == "mariadb":
        return _galera(config, backend, outdir)
    return [not_applicable("failovers and node kills", "SQLite has no standby and no cluster: "
                                                       "one file, one host")]
