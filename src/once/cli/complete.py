"""Shell completion of job names from the ledger, where that is cheap, of zone names (--tz)
and of period specs (--every).

Only a SQLite ledger is read: the one `--db` or ONCE_DATABASE_URL names, else the default
file under $XDG_STATE_HOME/once/. It is opened read-only and never created (the query is
once.ledger.sqlite.job_names; this module holds no SQL); a server ledger (PostgreSQL, MySQL,
MariaDB) is not asked, since a <Tab> must not wait for the network. Any error completes
nothing. With `--namespace` or ONCE_NAMESPACE, only that namespace's jobs are
offered, without their `NS:` prefix (as `--job` takes them).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click

# How long a <Tab> may wait for SQLite's lock while a claim writes.
BUSY_TIMEOUT = 0.2


def job_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """click `shell_complete` callable: the ledger's job names that start with `incomplete`."""
    try:
        names = _job_names(ctx.params or {}, incomplete)
    except Exception:  # completion must never break the shell: offer nothing instead
        return []
    given = (ctx.params or {}).get(param.name or "")
    if isinstance(given, tuple | list):  # status, check: the jobs named so far go
        names = [name for name in names if name not in given]
    return names


def _job_names(params: dict[str, Any], incomplete: str) -> list[str]:
    from once.ledger import default_url, dialects, parse_url

    url = params.get("db") or os.environ.get("ONCE_DATABASE_URL") or default_url()
    namespace = params.get("namespace") or os.environ.get("ONCE_NAMESPACE")
    target = parse_url(url)
    names = dialects.of(target).job_names(target, BUSY_TIMEOUT)  # SQLite's file alone
    if namespace:
        prefix = namespace + ":"
        names = [name[len(prefix) :] for name in names if name.startswith(prefix)]
    return [name for name in names if name.startswith(incomplete)]


def every_specs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """click `shell_complete` callable for --every: the specs once.periods takes, but for the
    spellings that say the same as another (1m, 60m, 1h, 24h)."""
    from once.periods import every_specs as specs

    return [spec for spec in specs() if spec.startswith(incomplete)]


def zone_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """click `shell_complete` callable for --tz: the IANA zones this Python knows (the system's
    tzdata, else the tzdata package), matched case-insensitively (`europe/b` finds
    Europe/Berlin)."""
    try:
        from zoneinfo import available_timezones

        zones = available_timezones()
    except Exception:  # no tzdata at all: offer nothing rather than break the shell
        return []
    prefix = incomplete.lower()
    return sorted(zone for zone in zones if zone.lower().startswith(prefix))
