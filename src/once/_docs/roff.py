"""The roff engine: text made safe for groff, the markup the prose uses, and the requests of
man(7) that the page is made of. It knows nothing of once or click: it imports only the
standard library.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SPECIALS = {
    "\\": "\\e",
    "-": "\\-",
    "'": "\\(aq",
    "`": "\\(ga",
    "^": "\\(ha",
    "~": "\\(ti",
    '"': "\\(dq",
}
# `code` is set in bold, <PLACEHOLDER> in italics.
_SPAN = re.compile(r"`([^`]+)`|<([A-Z][A-Za-z0-9_]*)>")


def esc(text: str) -> str:
    """Text made safe inside a roff line.

    Backslashes, hyphens (as minus signs, so that options copy and paste), quotes and the
    characters groff would typeset as something else are escaped; anything outside ASCII
    becomes a \\[uXXXX] glyph so that the page does not depend on the reader's locale.
    """
    out = []
    for ch in text:
        if ch in _SPECIALS:
            out.append(_SPECIALS[ch])
        elif ch == "\t":
            out.append(" ")
        elif ch != "\n" and (ord(ch) < 32 or ord(ch) == 127):
            continue
        elif ord(ch) > 127:
            out.append(f"\\[u{ord(ch):04X}]")
        else:
            out.append(ch)
    return "".join(out)


def markup(text: str) -> str:
    """esc(), with `code` in bold and <PLACEHOLDER> in italics."""
    out: list[str] = []
    pos = 0
    for match in _SPAN.finditer(text):
        out.append(esc(text[pos : match.start()]))
        if match.group(1) is not None:
            out.append(bold(match.group(1)))
        else:
            out.append(italic(match.group(2)))
        pos = match.end()
    out.append(esc(text[pos:]))
    return "".join(out)


def bold(text: str) -> str:
    return f"\\fB{esc(text)}\\fR"


def italic(text: str) -> str:
    return f"\\fI{esc(text)}\\fR"


def line(text: str) -> str:
    """One input line: a leading dot or apostrophe would make it a request."""
    return "\\&" + text if text.startswith((".", "'")) else text


def macro(name: str, *args: str) -> str:
    """A request line; each argument escaped, quoted when it holds a space."""
    quoted = [f'"{esc(a)}"' if (" " in a or not a) else esc(a) for a in args]
    return " ".join([f".{name}", *quoted])


def paragraphs(text: str) -> list[list[str]]:
    """Help text (click's conventions) as paragraphs of stripped lines.

    Text after a form feed is not shown, as in --help; a paragraph that starts with \\b keeps
    its line breaks (it is returned with a leading "\\b" line).
    """
    text = text.split("\f", 1)[0]
    found: list[list[str]] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        rows = [row.strip() for row in block.splitlines()]
        rows = [row for row in rows if row]
        if rows:
            found.append(rows)
    return found


def prose(text: str, lead: str = ".PP", sep: str = ".PP") -> list[str]:
    """Help text or data prose as roff: `lead` before the first paragraph (none when empty),
    `sep` between paragraphs (.IP keeps them inside a .TP entry)."""
    out: list[str] = []
    for n, rows in enumerate(paragraphs(text)):
        if n:
            out.append(sep)
        elif lead:
            out.append(lead)
        if rows[0] == "\b":
            out.extend([".nf", *(line(markup(row)) for row in rows[1:]), ".fi"])
        else:  # marked up whole, so that `code` may go on over a line break
            out.extend(line(row) for row in markup("\n".join(rows)).split("\n"))
    return out


def code(block: str) -> list[str]:
    """A literal block, indented, in a fixed-width font where the device has one."""
    rows = [line(esc(row.rstrip())) if row.strip() else "" for row in block.strip("\n").split("\n")]
    return [".PP", ".RS 4", ".EX", *(row or "\\&" for row in rows), ".EE", ".RE"]


_WORD = re.compile(r"(?<![^ ])(?=[^ ]*(?:\\-|\\f[BI]|_|/))(?!\\%)")


def unhyphenated(lines: Sequence[str]) -> list[str]:
    """Text lines with \\% before every word that holds an option, a variable, a path or a
    font change, so that groff never hyphenates `--max-at-tempts`; literal blocks unchanged."""
    out = []
    literal = False
    for text in lines:
        if text.startswith("."):
            request = text[1:].split(" ")[0]
            literal = request in ("EX", "nf") or (literal and request not in ("EE", "fi"))
        elif not literal:
            text = _WORD.sub("\\\\%", text)
        out.append(text)
    return out
