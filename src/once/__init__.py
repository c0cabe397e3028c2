"""once: run a scheduled command exactly once per period, however many machines fire it.

For jobs written in Python (see once.api):

    import once

    with once.claim("nightly", every="day", tz="Europe/Berlin") as run:
        if run.won:
            ...

and for a scheduler that must run on one process of many (once.lead):

    with once.lead("scheduler", db="postgresql://app@db/ops") as leader:
        ...  # run it until leader.lost is set
"""

# Nothing imported (typing's TYPE_CHECKING, __future__'s annotations): the `once` script
# imports this package before once.cli.main can take a Ctrl-C (once.cli), and typing's import
# was most of that window.
TYPE_CHECKING = False

__version__ = "0.1.0"

__all__ = ["FencedOut", "InputError", "Leader", "Run", "__version__", "claim", "lead"]

if TYPE_CHECKING:
    from typing import Any

    from once.api import FencedOut, Leader, Run, claim, lead
    from once.limits import InputError


def __getattr__(name: str) -> "Any":
    # Lazy: `once run` imports this package on every cron fire and needs none of the API.
    if name == "InputError":
        from once.limits import InputError

        return InputError
    if name in ("claim", "Run", "FencedOut", "lead", "Leader"):
        from once import api

        return getattr(api, name)
    raise AttributeError(f"module 'once' has no attribute {name!r}")
