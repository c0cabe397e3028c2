"""Shell completion of job names from the ledger, where that is cheap.

Only a SQLite ledger is read: the one `--db` or ONCE_DATABASE_URL names, else the default
file under $XDG_STATE_HOME/once/. It is opened read-only and never created; a server ledger
(PostgreSQL, MySQL, MariaDB) is not asked, since a <Tab> must not wait for the network. Any
error completes nothing. With `--namespace` or ONCE_NAMESPACE, only that namespace's jobs are
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
        return _job_names(ctx.params or {}, incomplete)
    except Exception:  # completion must never break the shell: offer nothing instead
        return []


def _job_names(params: dict[str, Any], incomplete: str) -> list[str]:
    import sqlite3
    from urllib.parse import quote

    from once.ledger import default_url, parse_url

    url = params.get("db") or os.environ.get("ONCE_DATABASE_URL") or default_url()
    namespace = params.get("namespace") or os.environ.get("ONCE_NAMESPACE")
    target = parse_url(url)
    if target.dialect != "sqlite" or not os.path.isfile(target.path):
        return []
    uri = "file:" + quote(os.path.abspath(target.path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT)
    try:
        rows = conn.execute("SELECT job FROM once_jobs ORDER BY job").fetchall()
    finally:
        conn.close()
    names = [row[0] for row in rows if isinstance(row[0], str)]
    if namespace:
        prefix = namespace + ":"
        names = [name[len(prefix) :] for name in names if name.startswith(prefix)]
    return [name for name in names if name.startswith(incomplete)]
