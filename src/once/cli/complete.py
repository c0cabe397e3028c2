"""Shell completion of job names and lead names (`once lead`) from the ledger, where that is
cheap, of zone names (--tz) and of period specs (--every).

Only a SQLite ledger is read: the one `--db` or ONCE_DATABASE_URL names, else the default
file under $XDG_STATE_HOME/once/. It is opened read-only and never created (the queries are
once.ledger.sqlite.job_names and lead_names; this module holds no SQL); a server ledger
(PostgreSQL, MySQL, MariaDB) is not asked, since a <Tab> must not wait for the network. Any
error completes nothing (of that kind: a ledger where no `once lead` has run still offers its
jobs). With `--namespace` or ONCE_NAMESPACE, only that namespace's names are offered, without
their `NS:` prefix (as `--job` and `--name` take them). A name the shell would read (a space,
`;`, `$`, a quote, a glob) is never offered: click's scripts put what they are given on the
command line as it is, and a name in the ledger is anyone's text (an outside attacker's
finding: `x;touch${IFS}f` completed runs touch when the line is entered).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import click

    from once.ledger import Target
    from once.ledger.dialect import Dialect

    Read = Callable[[Dialect, Target, float], list[str]]

# How long a <Tab> may wait for SQLite's lock while a claim writes.
BUSY_TIMEOUT = 0.2
# What a shell takes as it is, unquoted: shlex.quote's own safe set.
PLAIN = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


def job_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """click `shell_complete` callable: the ledger's job names that start with `incomplete`."""
    return _offer(ctx, param, incomplete, jobs=True)


def lead_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """For `once lead --name`: every lead name the ledger has had, retired ones too (a name
    used again goes on from its terms)."""
    return _offer(ctx, param, incomplete, leads="retired")


def job_or_lead_names(ctx: click.Context, param: click.Parameter,
                      incomplete: str) -> list[str]:
    """For `once status` and `once check`, whose NAME is a job's or a lead name's: both (the
    lead names alone with `--leads`); a retired name is neither's."""
    leads_only = bool((ctx.params or {}).get("leads"))
    return _offer(ctx, param, incomplete, jobs=not leads_only, leads="live")


def history_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """For `once history`: job names and the lead names with terms (retired ones keep theirs);
    with `--lead`, the lead names alone."""
    lead_only = bool((ctx.params or {}).get("lead"))
    return _offer(ctx, param, incomplete, jobs=not lead_only, leads="retired")


def _offer(ctx: click.Context, param: click.Parameter, incomplete: str, jobs: bool = False,
           leads: str | None = None) -> list[str]:
    """The names of the kinds asked for, each read on its own (a failed read offers nothing of
    its kind), sorted, without those the parameter was given already (status, check)."""
    params = ctx.params or {}
    names: set[str] = set()
    if jobs:
        names.update(_names(params, incomplete, lambda d, t, s: d.job_names(t, s)))
    if leads:
        names.update(_names(params, incomplete,
                            lambda d, t, s: d.lead_names(t, s, retired=leads == "retired")))
    given = params.get(param.name or "")
    if isinstance(given, tuple | list):  # status, check: the names given so far go
        names.difference_update(given)
    return sorted(names)


def _names(params: dict[str, Any], incomplete: str, read: Read) -> list[str]:
    try:
        from once.ledger import default_url, dialects, parse_url

        url = params.get("db") or os.environ.get("ONCE_DATABASE_URL") or default_url()
        namespace = params.get("namespace") or os.environ.get("ONCE_NAMESPACE")
        target = parse_url(url)
        names = read(dialects.of(target), target, BUSY_TIMEOUT)  # SQLite's alone
    except Exception:  # completion must never break the shell: offer nothing instead
        return []
    if namespace:
        prefix = namespace + ":"
        names = [name[len(prefix) :] for name in names if name.startswith(prefix)]
    return [name for name in names if name.startswith(incomplete) and PLAIN.fullmatch(name)]


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
