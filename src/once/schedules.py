"""The schedule of `--every SPEC` or `--cron EXPR`: the one place that picks between the
period engine's two kinds, above both (once.periods holds the `--every` schedules and what
every schedule shares, once.cron the cron schedules on top of it).

Pure, as they are. once.cron (and cronsim with it) is imported only when a cron schedule is
built, so that `--every` schedules load neither.
"""

from __future__ import annotations

from once.periods import Schedule, SpecError, every


def cron(expr: str, tz: str) -> Schedule:
    """The schedule of `--cron EXPR`."""
    from once.cron import CronSchedule  # here: `--every` schedules never load it

    return CronSchedule(expr, tz)


def schedule(every_spec: str | None, cron_expr: str | None, tz: str) -> Schedule:
    """The schedule of exactly one of --every and --cron."""
    if every_spec is not None and cron_expr is not None:
        raise SpecError("use --every or --cron, not both")
    if every_spec is not None:
        return every(every_spec, tz)
    if cron_expr is not None:
        return cron(cron_expr, tz)
    raise SpecError("use --every SPEC or --cron EXPR")
