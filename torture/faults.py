"""Scenarios 2 and 3: owner faults and database faults, each a storm (see storm.py)."""

from __future__ import annotations

import random
from pathlib import Path

from common import Backend, Config, Row, not_applicable
from storm import (
    ConnectionKills,
    Injector,
    OwnerFaults,
    ServerRestarts,
    Spec,
    SqliteLocks,
    Storm,
)


def _storm(config: Config, backend: Backend, outdir: Path, spec: Spec, injector: Injector,
           title: str, label: dict[str, str]) -> list[Row]:
    url = backend.new_ledger()
    storm = Storm(config, backend, url, outdir, spec, injector)
    storm.blow()
    verdict = storm.verdict()
    rows: dict[str, Row] = {}
    verdict.judge_faults(rows, lambda kind: label.get(kind, kind))
    for kind, name in label.items():  # a fault that never found a target still gets its row
        rows.setdefault(kind, Row(name))
    errors = getattr(injector, "errors", [])
    result = [rows[k] for k in label] + [verdict.periods_row(title)]
    if errors:
        result[-1].note(f"the fault itself failed {len(errors)} times: {errors[0]}")
    return result


def owner_faults(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    rng = random.Random(config.rng.random())
    spec = Spec(job="owner-faults", periods=config.count(60, 6),
                limit=config.span(300, 120))
    return _storm(config, backend, outdir / "owner-faults", spec, OwnerFaults(rng),
                  f"owner faults: {spec.periods} periods converge, each finished once", {
                      "SIGKILL": "owner SIGKILL, command running",
                      "SIGSTOP": "owner SIGSTOP past --stale-after, SIGCONT",
                      "SIGTERM": "owner SIGTERM, command running",
                  })


# Under database faults a finished command whose result cannot be recorded in time is run
# again (docs/concepts/liveness.md: exit 75, the row goes stale and is retried): at least
# once, not twice without a cause.
CONVERGED = "periods converge, each finished once (or redone as documented)"


def _db_spec(job: str, config: Config) -> Spec:
    """Fewer wrappers at a time, longer work: the storm lasts long enough for many faults."""
    return Spec(job=job, periods=config.count(60, 6), work=(1.0, 8.0), max_live=10,
                limit=config.span(300, 150))


def database_faults(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    rows: list[Row] = []
    rng = random.Random(config.rng.random())
    if backend.name == "postgresql":
        if backend.can_restart:
            spec = _db_spec("restarts", config)
            rows += _storm(config, backend, outdir / "restarts", spec,
                           ServerRestarts(rng, (3.0, 6.0), (0.5, 6.0)),
                           f"server restarts: {spec.periods} {CONVERGED}",
                           {"server restart": "PostgreSQL stopped mid-run, restarted"})
        else:
            rows.append(not_applicable("PostgreSQL stopped mid-run, restarted",
                                       "TORTURE_POSTGRES_URL names an outside server, "
                                       "which the torture never stops"))
    if backend.can_kill_connections:
        spec = _db_spec("kills", config)
        kill = ("pg_terminate_backend" if backend.name == "postgresql"
                else "KILL CONNECTION")
        rows += _storm(config, backend, outdir / "kills", spec,
                       ConnectionKills(rng, (0.3, 0.8)),
                       f"connection kills: {spec.periods} {CONVERGED}",
                       {"connections killed": f"connections killed server-side ({kill})"})
    if backend.name == "sqlite":
        spec = _db_spec("locks", config)
        rows += _storm(config, backend, outdir / "locks", spec,
                       SqliteLocks(rng, (1.5, 4.0), (0.5, 6.0)),
                       f"write locks: {spec.periods} {CONVERGED}",
                       {"write lock held": "SQLite write lock held by an outsider"})
    if backend.name == "mariadb":
        from deadlocks import deadlocks

        rows.append(deadlocks(config, backend, outdir / "deadlocks"))
    return rows
