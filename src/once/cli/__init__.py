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
    from types import FrameType
    from typing import NoReturn


def main() -> "NoReturn":
    global _loading
    if os.getpid() == 1:
        _stop_signals_end_init()
    try:
        from once.cli.main import main as command_line

        _loading = False
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
    each ends once as death by it would elsewhere: 128+N (_end_as_init). (`_signal`: `signal`
    imports enum.)"""
    import _signal  # type: ignore[import-not-found]  # signal's C half, no stubs

    for number in (_signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(number) == _signal.SIG_DFL:
            _signal.signal(number, _end_as_init)


_loading = True  # until the command line is imported


def _end_as_init(number: int, frame: "FrameType | None") -> "NoReturn":
    # While once loads, or inside an import, at once: CPython drops (or turns into another)
    # an exception a handler raises at some moments of one (its compiler folding a constant,
    # importlib's module locks, a dataclass's __set_name__), and the command then ran.
    # Elsewhere (a hook, after the result) as an exit, so that what once cleans up on its way
    # out is cleaned.
    if _loading:
        os._exit(128 + number)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            os._exit(128 + number)
        frame = frame.f_back
    raise SystemExit(128 + number)
