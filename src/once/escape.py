"""Text from outside, made safe to show: control characters escaped as JSON escapes them.

Owners (ONCE_OWNER), rerun reasons, watermarks, job names from a ledger written by any
client, URLs: a terminal obeys what they hold (ESC sequences set its title, clear it, draw
links), and a newline in one would forge a line of `once check`. Every report and every
`once:` line shows such text through shown(), so that each stays one line of printable
characters. JSON output needs nothing: json.dumps escapes the same characters.

Standard library only: `once run` (the hot path) uses it for its own lines.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def shown(text: str) -> str:
    """text with every character that is not printable (controls, line and paragraph
    separators, format characters such as bidi overrides, lone surrogates) escaped:
    \\n, \\t, \\u001b, \\U000e0001. Spaces stay; a printable text comes back unchanged."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def shown_word(text: str) -> str:
    """shown(text), spaces escaped too (\\u0020): a field of a line that scripts split on
    spaces (`once check`'s job and period) stays one field whatever the ledger holds."""
    return shown(text).replace(" ", "\\u0020")


def shown_lines(text: str) -> str:
    """shown() for many lines of output (`once logs`): line breaks and tabs stay, every other
    control character (a carriage return, ESC, a bidi override) is escaped, so the output
    can neither redraw the terminal nor overwrite the line before it. A CRLF is a line
    break."""
    return "\n".join("\t".join(shown(part) for part in line.removesuffix("\r").split("\t"))
                     for line in text.split("\n"))
