"""Scenario: a rolling upgrade. A fleet whose hosts run the release before this one (schema
4, the last commit before schema 5: tests/versions.py builds it) until they are upgraded to
this one, one host after another, while a storm (storm.py) of cron-like fires works through
the periods of one job.

The ledger is the older release's (it made the tables). Each fire picks a host and runs
that host's `once`: `once catchup --since P0`, over a window, or `once run --catchup N`.
Half the hosts are upgraded before the ledger is: the first current `once` whose claim
reaches it upgrades it. From then on the old hosts fire on their own schedule too, each
fire of theirs must be refused (exit 75, one refusal naming both versions, nothing
claimed), and one more host is upgraded after every three of them. The attempts the older
release claimed before go on: their renewals and finishes still work, and no current caller
takes one over before its owner's promise. Meanwhile owners of both releases are killed
(SIGKILL) and stopped past their --stale-after (SIGSTOP, SIGCONT), and the first two current
`once` started while the ledger is the older one's are killed with SIGKILL a moment after
they start (an upgrade cut short).

The verdict is the storms' (verdict.py: overlap, twice, never done), plus a row for the old
hosts' fires after the upgrade, and notes on who claimed what.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from itertools import pairwise
from pathlib import Path

from common import CHILD, ONCE, Backend, Config, Proc, Row, base_env, histogram, status_word
from storm import Fault, OwnerFaults, Spec, Storm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import versions  # the older builds, cached outside the work tree

OLD = 4  # the schema of the release a fleet upgrades from
NEW = 5
HOSTS = 6


class Rolling(Storm):
    """The storm's fires, each from a host of the fleet, old or upgraded."""

    def __init__(self, config: Config, backend: Backend, url: str, outdir: Path, spec: Spec,
                 injector: Upgrades, old_once: str) -> None:
        super().__init__(config, backend, url, outdir, spec, injector)
        self.old_once = old_once
        self.hosts = [old_once] * HOSTS  # each host's `once`
        self.upgraded_at: float | None = None  # wall clock when once_meta first said 5
        self.next_look = 0.0  # when to read once_meta next (monotonic)

    def fire(self, old_host: bool = False) -> None:
        once = self.old_once if old_host else self.rng.choice(self.hosts)
        argv = self.argv()
        # An upgraded host fires its crontab's `once run --catchup N` until the ledger is
        # upgraded: a catch-up that finds nothing to claim would not upgrade it.
        while once == ONCE and self.upgraded_at is None and argv[1] != "run":
            argv = self.argv()
        argv[0] = once
        self.start([*argv, "--", *CHILD], "new" if once == ONCE else "old")  # the tag

    def live(self) -> list[Proc]:
        # An old host's fire after the upgrade is refused at once: it takes no place among
        # the storm's live wrappers, so that the old hosts fire as often as they would.
        return [p for p in super().live() if not self.after_upgrade(p)]

    def after_upgrade(self, proc: Proc) -> bool:
        """An old host's fire that started after the ledger was upgraded."""
        return (proc.tag == "old" and self.upgraded_at is not None
                and proc.started > self.upgraded_at + 0.5)

    def done_in_ledger(self) -> bool:
        # Not before the whole fleet runs the new release and the ledger is upgraded (a
        # catch-up that finds nothing to claim upgrades nothing): the upgrade is what is tried.
        return (self.old_once not in self.hosts and self.upgraded_at is not None
                and super().done_in_ledger())

    def ledger_version(self) -> int:
        try:
            rows = self.backend.query(
                self.url, "SELECT value FROM once_meta WHERE name = 'schema_version'")
        except Exception:  # a moment the ledger is busy: ask again later
            return 0
        return int(rows[0][0]) if rows else 0


class Upgrades(OwnerFaults):
    """The upgrade, host by host, on top of the owner faults (SIGKILL and SIGSTOP only: a
    SIGTERM is an orderly stop, which every release handles alike)."""

    KINDS = ("SIGKILL", "SIGSTOP")

    def __init__(self, rng: random.Random, first: float, every: tuple[float, float],
                 cut_short: int) -> None:
        super().__init__(rng)
        self.next_upgrade = time.monotonic() + first
        self.upgrade_every = every
        self.cut_short = cut_short  # how many upgrading wrappers to kill
        self.watched: set[int] = set()
        self.pending_kills: list[tuple[float, Proc]] = []
        self.upgrades: list[float] = []
        self.next_old_fire = 0.0
        self.old_fires = 0  # old hosts' fires after the upgrade, since the last host's

    def tick(self, storm: Storm, now: float) -> None:
        assert isinstance(storm, Rolling)
        old_left = storm.old_once in storm.hosts
        # After the upgrade the old hosts fire on their own schedule, however busy the storm's
        # wrappers keep it (their fires are what must be refused).
        if storm.upgraded_at is not None and old_left and now >= self.next_old_fire:
            storm.fire(old_host=True)
            self.old_fires += 1
            self.next_old_fire = now + self.rng.uniform(0.4, 0.8)
        # Half the fleet stays old until the ledger is upgraded; then each old host fires a
        # few times before the next is upgraded.
        held = (storm.hosts.count(ONCE) >= HOSTS // 2 if storm.upgraded_at is None
                else self.old_fires < 3)
        if now >= self.next_upgrade and old_left and not held:
            storm.hosts[storm.hosts.index(storm.old_once)] = ONCE
            self.upgrades.append(time.time())
            self.next_upgrade = now + self.rng.uniform(*self.upgrade_every)
            self.old_fires = 0
        if storm.upgraded_at is None and now >= storm.next_look:
            storm.next_look = now + 0.2
            if storm.ledger_version() >= NEW:
                storm.upgraded_at = time.time()
            else:
                self._cut_upgrades_short(storm, now)
        for when, proc in list(self.pending_kills):
            if now >= when:
                self.pending_kills.remove((when, proc))
                if proc.poll() is None and proc.signal(signal.SIGKILL, "SIGKILL"):
                    self.add(Fault("upgrade cut short", time.time(), time.time(),
                                   detail=proc.name))
        super().tick(storm, now)

    def _cut_upgrades_short(self, storm: Rolling, now: float) -> None:
        """A current wrapper started while the ledger is still the older one's is upgrading
        it: kill a few of them a moment after they start."""
        for proc in storm.procs:
            if (proc.tag == "new" and proc.pid not in self.watched and self.cut_short > 0
                    and proc.poll() is None):
                self.watched.add(proc.pid)
                self.cut_short -= 1
                self.pending_kills.append((now + self.rng.uniform(0.05, 0.6), proc))


def _refusals_row(storm: Rolling) -> Row:
    """Every fire of the older release that started after the upgrade: exit 75 (refused by
    the schema version, or the ledger too busy to answer), nothing claimed; or a catch-up
    whose reads (which name no renamed column) found nothing to claim: exit 0, silent,
    nothing claimed."""
    row = Row(f"schema-{OLD} fires on the upgraded ledger: refused (exit 75), nothing claimed")
    claimed = {proc.pid for proc in storm.owners.values()}
    after = [p for p in storm.procs if storm.after_upgrade(p)]
    idle, other = 0, []
    for proc in after:
        problems = []
        if proc.pid in claimed or any(isinstance(e.get("fence"), int) for e in proc.events()):
            problems.append("it claimed a period")
        messages = [str(e.get("message", "")) for e in proc.events()]
        if proc.argv[1] == "catchup" and proc.returncode == 0 and not messages:
            idle += 1  # its reads found nothing to claim: it sent no claim to be refused
        elif proc.returncode != 75:
            problems.append(f"ended with {status_word(proc.returncode)}, not 75")
        elif not any(f"schema is version {NEW}, newer than this once knows ({OLD})" in m
                     or "fires" in m for m in messages):
            # 75 for another cause (SQLite's write lock held past the busy timeout on a
            # loaded machine): nothing claimed either, noted with what it said.
            other.append(messages[0][-80:] if messages else proc.stderr()[-80:])
        row.judge(problems, proc.name)
    if not after:
        row.note("no fire of the older release after the upgrade")
    if idle:
        row.note(f"{idle} catch-ups found nothing to claim (exit 0, nothing written)")
    if other:
        row.note(f"{len(other)} exit 75 for another cause, e.g. {other[0]!r}")
    return row


def _notes(storm: Rolling, injector: Upgrades, row: Row) -> None:
    """Who claimed what: the older release's claims before the upgrade, the takeovers of an
    older owner's claim by a current one."""
    owners: dict[int, str] = {}
    for (_period, fence), proc in storm.owners.items():
        owners[fence] = proc.tag
    for proc in storm.procs:
        for event in proc.events():
            if isinstance(event.get("fence"), int):
                owners.setdefault(event["fence"], proc.tag)
    attempts = storm.backend.query(
        storm.url, "SELECT period, attempt, fence FROM once_attempts WHERE job = %s "
                   "ORDER BY period, attempt", (storm.spec.job,))
    by_period: dict[str, list[int]] = {}
    for period, _attempt, fence in attempts:
        by_period.setdefault(period, []).append(int(fence))
    across = sum(1 for fences in by_period.values() for a, b in pairwise(fences)
                 if owners.get(a) == "old" and owners.get(b) == "new")
    old_claims = sum(1 for tag in owners.values() if tag == "old")
    row.note(f"claims: schema {OLD} {old_claims}, schema {NEW} "
             f"{sum(1 for t in owners.values() if t == 'new')}; "
             f"takeovers of a schema-{OLD} claim by schema {NEW}: {across}")
    when = (f"{storm.upgraded_at - storm.procs[0].started:.0f}s in"
            if storm.upgraded_at and storm.procs else "never")
    row.note(f"ledger upgraded {when}; {len(injector.upgrades)} hosts upgraded; fires by "
             f"release: {histogram([p.tag for p in storm.procs])}")
    final = storm.ledger_version()
    if final != NEW:
        row.fail(f"the ledger ended at schema version {final}, not {NEW}")


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    old = versions.build_all([OLD])[OLD]
    rng = random.Random(config.rng.random())
    spec = Spec(job="rolling", periods=config.count(60, 6), work=(1.0, 8.0), max_live=12,
                limit=config.span(300, 150))
    url = backend.new_ledger()
    outdir = outdir / "rolling"
    outdir.mkdir(parents=True, exist_ok=True)
    made = Proc([old.once, "schema"], base_env(url, outdir), outdir, "schema")
    if made.wait(120) != 0:
        row = Row("rolling upgrade: the older release makes its ledger")
        row.fail(f"`once schema` of schema {OLD} ended {made.returncode}: {made.stderr()}")
        return [row]
    injector = Upgrades(rng, first=config.span(10, 2), every=(3.0, 6.0), cut_short=2)
    storm = Rolling(config, backend, url, outdir, spec, injector, old.once)
    storm.blow()
    verdict = storm.verdict()
    labels = {"SIGKILL": "owner SIGKILL, command running (either release)",
              "SIGSTOP": "owner SIGSTOP past --stale-after, SIGCONT (either release)",
              "upgrade cut short": f"schema-{NEW} once killed while it upgrades the ledger"}
    rows: dict[str, Row] = {}
    verdict.judge_faults(rows, lambda kind: labels.get(kind, kind))
    periods = verdict.periods_row(f"rolling upgrade {OLD} -> {NEW} over {HOSTS} hosts: "
                                  f"{spec.periods} periods converge, each finished once")
    _notes(storm, injector, periods)
    return [*(rows.get(k) or Row(name) for k, name in labels.items()), periods,
            _refusals_row(storm)]
