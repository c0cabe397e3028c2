"""The entry point of `make man` and `make completions`:

    python -m once._docs man > man/once.1              (make man)
    python -m once._docs completions completions/      (make completions)
    python -m once._docs markdown docs/reference       (make man: the docs' reference)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from once._docs.completions import write_completions
from once._docs.man import man_page
from once._docs.markdown import write_pages

USAGE = ("usage: python -m once._docs man | python -m once._docs completions DIRECTORY"
         " | python -m once._docs markdown DIRECTORY")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["man"]:
        sys.stdout.write(man_page())
        return 0
    if len(args) == 2 and args[0] == "completions":
        write_completions(Path(args[1]))
        return 0
    if len(args) == 2 and args[0] == "markdown":
        write_pages(Path(args[1]))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
