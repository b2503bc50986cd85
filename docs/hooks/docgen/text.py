"""Markdown helpers of the generated reference: escaping, tables, docstrings, RST tables."""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Iterable, Sequence

# A logger under "mkdocs": `mkdocs build --strict` counts its warnings as errors.
log = logging.getLogger("mkdocs.plugins.leasing_docs")

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)


def warn(message: str) -> None:
    """A documentation gap the build must not pass in strict mode."""
    log.warning("leasing reference: %s", message)


def escape(text: str) -> str:
    """Text for a Markdown paragraph or table cell: `<`, `>` and `|` outside code spans."""
    out: list[str] = []
    last = 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_escape_plain(text[last : match.start()]))
        out.append(match.group(0).replace("|", "\\|"))
        last = match.end()
    out.append(_escape_plain(text[last:]))
    return "".join(out)


def _escape_plain(text: str) -> str:
    for char, escaped in (("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*"), ("_", "\\_")):
        text = text.replace(char, escaped)
    return text


def code(text: str) -> str:
    """`text` as an inline code span (a longer fence when it holds backticks)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; each cell is taken as it is (escape it first)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [" ".join(cell.split("\n")) for cell in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def docstring(obj: object) -> str:
    """An object's docstring as Markdown: prose escaped, indented examples kept as code."""
    doc = inspect.getdoc(obj)
    if not doc:
        return ""
    return docstring_text(doc)


def docstring_text(doc: str) -> str:
    """Docstring text as Markdown.

    Prose lines are escaped; a block indented by four spaces after a blank
    line (an example) becomes a fenced Python block, so it is shown as written.
    """
    blocks: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            example: list[str] = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                example.append(lines[i][4:])
                i += 1
            while example and not example[-1].strip():
                example.pop()
            blocks.append("```python\n" + "\n".join(example) + "\n```\n\n")
            continue
        blocks.append(escape(line) + "\n" if line.strip() else "\n")
        i += 1
    return "".join(blocks).strip() + "\n"


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    if not doc:
        return ""
    paragraph = inspect.cleandoc(doc).split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def rst_simple_table(doc: str) -> tuple[str, list[list[str]], str]:
    """Split a docstring around its one RST simple table (`====  ====` borders).

    Returns the text before the table, its body rows (continuation lines, whose
    first column is blank, joined to the row above; the header row dropped) and
    the text after it. A docstring without such a table gives (doc, [], "").
    """
    lines = doc.splitlines()
    borders = [i for i, line in enumerate(lines) if re.fullmatch(r"=+(\s+=+)+\s*", line)]
    if len(borders) < 2:
        return doc, [], ""
    first, last = borders[0], borders[-1]
    spans = [m.span() for m in re.finditer(r"=+", lines[first])]
    body = lines[(borders[1] + 1 if len(borders) > 2 else first + 1) : last]
    rows: list[list[str]] = []
    for line in body:
        if not line.strip():
            continue
        cells = []
        for index, (start, _end) in enumerate(spans):
            stop = len(line) if index == len(spans) - 1 else spans[index + 1][0]
            cells.append(line[start:stop].strip())
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells, strict=True)]
    before = "\n".join(lines[:first]).strip()
    after = "\n".join(lines[last + 1 :]).strip()
    return before, rows, after
