"""`make torture`: fault injection against real `once` processes and real databases.

Runs, on SQLite, PostgreSQL and MariaDB (one after the other, each in fresh databases that it
creates and drops):

1. contention: K periods x N processes released at one instant (`once run --lag` on a
   ledger without tables; `once catchup --since/--until` over K periods);
2. owner faults: a storm of cron-like re-fires while wrappers running real commands are
   killed (SIGKILL), stopped past --stale-after and continued (SIGSTOP, SIGCONT) and
   terminated (SIGTERM);
3. database faults: the embedded PostgreSQL server stopped and restarted mid-run;
   connections killed server-side (pg_terminate_backend, MariaDB KILL CONNECTION); SQLite's
   write lock held by an outsider; MariaDB duplicate-key deadlocks (three sessions);
4. mixed fleet: a storm of callers that disagree (--stale-after 2-8 s, --kill-after from 1 s
   to a third of it, catch-ups, reruns, cron-like fires) while guards are killed, wrappers
   killed, stopped and continued, every `once` process killed at once, and an outsider
   locks the running rows (SQLite: the write lock);
5. clocks: wrappers whose wall clock runs 10 minutes fast, an owner 10 minutes slow, one host
   clock stepped 10 minutes forward mid-run (libfaketime, on every backend), hosts behind and
   ahead by more than a period; ledger sessions in far-apart time zones;
6. bad input: hypothesis-generated argument vectors for run, catchup and periods; then
   hostile values (URLs, secret files, lengths at every limit, period edges, control
   characters and markup in every text field) through every command, each followed by every
   report (torture/hostile.py);
7. rolling upgrade: a fleet of hosts that run the release before this one (schema 4, built
   from its commit by tests/versions.py) upgraded one by one to this one while a storm works
   through the periods, owners of both releases killed and stopped, and the first upgrades
   cut short by SIGKILL; every fire of an old host after the upgrade must be refused;
8. high availability (torture/ha.py): HA servers of the scenario's own on loopback. On
   PostgreSQL a primary with a synchronous standby behind a multi-host URL
   (target_session_attrs=read-write), the primary crashed (stop -m immediate) at random
   moments, the standby promoted, a new standby built from it for the next failover; on
   MariaDB a three-node Galera cluster, callers spread across its nodes, a node killed
   (SIGKILL) and rejoined by a state transfer; both while a storm works through the periods
   and owners are killed, stopped and terminated. Every claim whose command ran must be in
   the ledger afterwards, and fences strictly increase per job, none reused (SQLite: n/a);
9. leader (torture/leader.py): `once lead` candidates of one name while leaders are killed,
   their guards killed, stopped past the lease and woken, cut off from the ledger by a relay
   that falls silent, and terminated: never two children alive at once (by their own log),
   terms strictly growing, each old child dead by its lease's deadline.

Each backend gets a table:

    scenario   what was done
    tried      how many times the scenario's fault or trial was made: a period contended, a
               wrapper killed / stopped / terminated, a server restart, a round of connection
               kills, a deadlock round, a skewed-clock round, an argument vector...
    held       how many of those left every invariant standing
    lost       how many broke one: a period run twice (by the commands' own log of finished
               work: a `done` line is written only when the work is finished), a period
               without a winner or never done, a command that finished after its period was
               taken over, a command that outlived its owner, a takeover before
               --stale-after by the database's clock, a traceback, a wrong exit status, a
               command run for bad input. Under database faults, a finish the ledger could
               not record in time is run again as the README says (exit 75; or 70 when the
               late write found the claim taken over): counted as "redone" in the notes, not
               lost (see storm.py)
    overlap    (storms, clocks) seconds two attempts of one period ran side by side, by the
               period's flock that every command holds (must be 0)
    twice      (storms) periods whose work was finished twice without a rerun or a
               documented cause (must be 0)
    never done (storms) periods the ledger does not say done by a finished command (0)
    redone     (storms) periods redone after an outage (or a failover), of the storm's
               periods (the outage storms: at most 10%)
    wrong-clock claims   (clocks) periods claimed by a host whose clock was off by more than
               the --max-clock-skew it checks (must be 0)
    live owners taken over   (clocks) claims taken from an owner that was alive (must be 0)
    notes      counts that explain the figures (exit statuses, takeovers, deadlock victims)

Under each table, one line totals those figures for the backend.
A row marked n/a does not apply to the backend (tried 0). Exits 1 when anything was lost,
0 otherwise. Details of every loss follow the tables.

Environment: TORTURE_SCALE (default 1.0) scales every count; TORTURE_BACKENDS (default
sqlite,postgresql,mariadb); TORTURE_POSTGRES_URL (default: an embedded server of the
torture's own, which it may stop and restart); TORTURE_MARIADB_URL (default
mariadb://root@127.0.0.1:3306/test); TORTURE_SCENARIOS (default
contention,owner,database,fleet,clocks,input,rolling,ha,leader); TORTURE_SEED; TORTURE_KEEP=1 keeps
the work directory (logs of every process) even when nothing was lost.
"""

from __future__ import annotations

import os
import platform
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import badinput
import clocks
import contention
import faults
import fleet
import ha
import leader
import rolling
from common import Backend, Config, Row, make_backend, remove_tree

SCENARIOS: dict[str, Callable[[Config, Backend, Path], list[Row]]] = {
    "contention": contention.run,
    "owner": faults.owner_faults,
    "database": faults.database_faults,
    "fleet": fleet.run,
    "clocks": clocks.run,
    "input": badinput.run,
    "rolling": rolling.run,
    "ha": ha.run,
    "leader": leader.run,
}


def main() -> int:
    scale = float(os.environ.get("TORTURE_SCALE", "1.0"))
    seed = int(os.environ.get("TORTURE_SEED", str(random.randrange(1, 10**6))))
    names = [b.strip() for b in os.environ.get(
        "TORTURE_BACKENDS", "sqlite,postgresql,mariadb").split(",") if b.strip()]
    wanted = [s.strip() for s in os.environ.get(
        "TORTURE_SCENARIOS", ",".join(SCENARIOS)).split(",") if s.strip()]
    unknown = [n for n in names if n not in ("sqlite", "postgresql", "mariadb")] + [
        s for s in wanted if s not in SCENARIOS]
    if unknown:
        print(f"torture: unknown backend or scenario {unknown[0]!r}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="once-torture-"))
    config = Config(scale=scale, seed=seed, workdir=workdir,
                    postgres_url=os.environ.get("TORTURE_POSTGRES_URL") or None,
                    mariadb_url=os.environ.get("TORTURE_MARIADB_URL",
                                               "mariadb://root@127.0.0.1:3306/test"),
                    backends=names)
    began = time.monotonic()
    print(f"once torture: scale {scale:g}, seed {seed}, backends {', '.join(names)}, "
          f"{os.cpu_count()} cores, {platform.python_version()}, work in {workdir}",
          flush=True)
    tables: list[tuple[str, list[Row], float]] = []
    for name in names:
        backend = make_backend(name, config)
        rows: list[Row] = []
        started = time.monotonic()
        try:
            backend.start()
            for scenario in wanted:
                t0 = time.monotonic()
                try:
                    found = SCENARIOS[scenario](config, backend,
                                                workdir / name / scenario)
                except Exception:
                    crashed = Row(f"{scenario}: the torture itself failed")
                    crashed.fail(traceback.format_exc())
                    found = [crashed]
                rows += found
                print(f"  {backend.describe()}: {scenario} done in "
                      f"{time.monotonic() - t0:.0f}s "
                      f"({sum(r.lost for r in found)} lost)", flush=True)
        except Exception:
            crashed = Row(f"{name}: the backend could not be set up")
            crashed.fail(traceback.format_exc())
            rows.append(crashed)
        finally:
            backend.drop_all()
            backend.stop()
        tables.append((backend.describe(), rows, time.monotonic() - started))
    lost = sum(r.lost for _, rows, _ in tables for r in rows)
    print()
    print(f"once torture, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, scale {scale:g}, seed {seed},"
          f" {os.cpu_count()} cores, {time.monotonic() - began:.0f}s")
    for title, rows, took in tables:
        print()
        print(render(f"{title} ({took:.0f}s)", rows))
    failures = [(title, r) for title, rows, _ in tables for r in rows if r.failures]
    if failures:
        print("\nLosses:")
        for title, r in failures:
            for what in r.failures[:20]:
                print(f"- {title} / {r.scenario}: {what}")
            if len(r.failures) > 20:
                print(f"- {title} / {r.scenario}: ... {len(r.failures) - 20} more")
    if lost or os.environ.get("TORTURE_KEEP"):
        print(f"\nlogs kept in {workdir}")
    else:
        remove_tree(workdir)
    print(f"\n{'FAILED' if lost else 'PASSED'}: {lost} lost")
    return 1 if lost else 0


def render(title: str, rows: list[Row]) -> str:
    """A Markdown table (readable as text, pasteable into the README), then the backend's
    figures that must be 0 (or, for redone, at most 10% of the outage storms' periods)."""
    lines = [f"**{title}**", "",
             "| scenario | tried | held | lost | overlap | twice | never done | redone "
             "| wrong-clock claims | live owners taken over | notes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        tried = str(r.tried) if r.tried or not r.notes or not r.notes[0].startswith("n/a") \
            else "n/a"
        overlap = "" if r.overlap is None else f"{r.overlap:.1f} s"
        redone = "" if r.redone is None else _fraction(*r.redone)
        cells = [r.scenario, tried, str(r.held), str(r.lost), overlap, _count(r.twice),
                 _count(r.never), redone, _count(r.wrong_clock), _count(r.live_takeovers),
                 "; ".join(r.notes).replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", totals(rows)])


def totals(rows: list[Row]) -> str:
    """One line of the figures the issues ask for, over the backend's rows."""
    def total(values: list[int | None]) -> int:
        return sum(v for v in values if v is not None)

    overlap = sum(r.overlap for r in rows if r.overlap is not None)
    outage = [r.redone for r in rows if r.redone is not None and r.scenario.startswith(
        OUTAGE_STORMS)]
    redone = _fraction(sum(p for p, _ in outage), sum(w for _, w in outage))
    return (f"Overlap {overlap:.1f} s; done twice {total([r.twice for r in rows])}; never "
            f"done {total([r.never for r in rows])}; redone after outages {redone} of the "
            f"outage storms' periods; periods claimed under a wrong clock "
            f"{total([r.wrong_clock for r in rows])}; takeovers of a live owner "
            f"{total([r.live_takeovers for r in rows])}.")


# The storms whose faults are the ledger's (faults.database_faults, the fleet's row locks,
# ha.py's failovers and node kills).
OUTAGE_STORMS = ("server restarts", "connection kills", "write locks", "mixed fleet",
                 "PostgreSQL failovers", "Galera node kills")


def _count(value: int | None) -> str:
    return "" if value is None else str(value)


def _fraction(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "0"


if __name__ == "__main__":
    sys.exit(main())
