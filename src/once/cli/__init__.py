"""The command line: click's options, help and exit statuses over the rest.

`main` is the `once` script's entry point (pyproject.toml); it loads the command line
(once.cli.main: click, the options) only when called, so that a Ctrl-C while Python loads
it, or after the command has ended, ends `once` as one during a report does (once.cli.main:
`once: interrupted`, status 130), never with a traceback. Nothing is imported from
once.cli.main here: the interrupted import may have left none of it."""

import os
import sys

TYPE_CHECKING = False  # not typing's, nor __future__'s annotations: imports widen the window
if TYPE_CHECKING:
    from typing import NoReturn


def main() -> "NoReturn":
    if os.getpid() == 1:
        _stop_signals_end_init()
    try:
        from once.cli.main import main as command_line

        command_line()
    except KeyboardInterrupt:  # outside click's handling of it
        try:
            # The blank line closes the terminal's ^C echo, as click's does.
            sys.stderr.write("\nonce: interrupted\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # stderr closed, or None
            pass
        raise SystemExit(130) from None


def _stop_signals_end_init() -> None:
    """As PID 1 (a container's init) the kernel drops a signal whose handler is the default:
    a SIGTERM or SIGHUP while Python loads once (its first tenth of a second: `docker stop` or
    the kubelet just after the container starts) was lost, and the command ran to its end (an
    outside attacker's finding). Until once takes them itself (a claim, a run, a candidate),
    each ends once as death by it would elsewhere: 128+N, at once (os._exit: CPython drops an
    exception a handler raises at some moments of an import, such as its compiler's folding
    of a constant, and the command then ran; nothing is claimed before once's own handlers).
    (`_signal`: `signal` imports enum.)"""
    import _signal  # type: ignore[import-not-found]  # signal's C half, no stubs

    for number in (_signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(number) == _signal.SIG_DFL:
            _signal.signal(number, _end_as_init)


def _end_as_init(number: int, _frame: object) -> "NoReturn":
    os._exit(128 + number)
