"""MkDocs hooks (mkdocs.yml `hooks:`): the site's changelog page is CHANGELOG.md itself, its
links into docs/ made relative to the site. Imports nothing of once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

CHANGELOG = Path(__file__).resolve().parent / "CHANGELOG.md"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "changelog.md":
        return markdown
    text = CHANGELOG.read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/", "](", text)
