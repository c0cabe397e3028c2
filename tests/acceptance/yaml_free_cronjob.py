"""Read the container command of examples/kubernetes/cronjob.yaml without a YAML library."""

from __future__ import annotations

from pathlib import Path


def command(path: Path) -> list[str]:
    """The `command:` list of the first container: one `- item` a line."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "command:")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    items = []
    for line in lines[start + 1:]:
        if len(line) - len(line.lstrip()) != indent or not line.strip().startswith("- "):
            break
        items.append(line.strip()[2:].strip())
    return items
