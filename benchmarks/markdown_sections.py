"""Replace one ``## `` section of a Markdown file, leaving the others as they are (the benchmark
scripts each own a section of docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, heading: str, section: str) -> None:
    """Write ``section`` (which starts with ``heading``) in place of the old text under
    ``heading`` (up to the next ``## `` heading or EOF); append it when absent."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip("\n") == heading), None)
    if start is None:
        body = text if text.endswith("\n") else text + "\n"
        path.write_text(body + "\n" + section, encoding="utf-8")
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = lines[end:]
    new = section if not tail else section + "\n"
    path.write_text("".join(lines[:start]) + new + "".join(tail), encoding="utf-8")
