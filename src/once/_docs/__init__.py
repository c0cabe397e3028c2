"""The man page and the shell completion scripts, generated from the click definitions.

    python -m once._docs man > man/once.1              (make man)
    python -m once._docs completions completions/      (make completions)

Everything about a command comes from `once.cli.main.cli`: its usage, its help text and, for each
option, its names, metavar, help, default and environment variable (explicit, or click's
ONCE_<COMMAND>_<NAME>), so the page cannot disagree with `--help`. The prose around it (the
description, environment, exit status, files and examples) is data. tests/unit/test_docs.py
fails when the committed files differ from what this package makes: run
`make man completions`.

A package, so that the words and the machinery live apart: whoever edits what the page says
opens `prose`, `exits` or `environment` (data only, no roff and no click), and whoever changes
how it is typeset opens the builders, where no paragraph of prose is in the way:

    prose         the words: description, limits, files, output, cron's traps, examples...
    exits         the exit statuses of every command
    environment   the variables once reads, and those it sets for the command
    roff          the roff engine: escaping, markup, requests (the standard library only)
    options       what click knows, as roff: commands, option entries, synopses
    man           man/once.1, one builder a section (SECTIONS)
    completions   completions/*, from click's templates
    __main__      the command line above

The modules import each other in that order only (prose, exits, environment and roff import
no other part of once). Nothing here is on the hot path: only `make`, the tests and the docs
import it.
"""
