"""The command line: click's options, help and exit statuses over the rest.

`main` is the `once` script's entry point (pyproject.toml); it loads the command line
(once.cli.main: click, the options) only when called, so that a Ctrl-C while Python loads
it, or after the command has ended, ends `once` as one during a report does (once.cli.main:
`once: interrupted`, status 130), never with a traceback. Nothing is imported from
once.cli.main here: the interrupted import may have left none of it."""

import sys

TYPE_CHECKING = False  # not typing's, nor __future__'s annotations: imports widen the window
if TYPE_CHECKING:
    from typing import NoReturn


def main() -> "NoReturn":
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
