"""Pages that show a file of the repository outside docs/ (BENCHMARKS.md, bench/README.md).

The file's relative links are written for its place in the repository; on
the site they are rewritten to the pages that show their targets. A link to
anything else outside docs/ is left as it is, and mkdocs' link validation
then fails the strict build, so such a link cannot go unnoticed.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from .text import warn

ROOT = Path(__file__).resolve().parents[3]

# Repository files that are pages of the site: path -> the page (relative to docs/).
SHOWN_AS = {
    "BENCHMARKS.md": "benchmarks.md",
    "bench/README.md": "benchmarks-method.md",
}

_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def _site_target(source: str, target: str) -> str:
    if re.match(r"^[a-z]+:", target) or target.startswith("#"):
        return target
    path, _, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if resolved in SHOWN_AS:
        page = SHOWN_AS[resolved]
    elif resolved.startswith("docs/"):
        page = resolved.removeprefix("docs/")
    else:
        return target
    return page + (f"#{anchor}" if anchor else "")


def include(source: str) -> str:
    """The text of repository file `source`, its links rewritten for a page at docs/'s root."""
    path = ROOT / source
    if not path.is_file():
        warn(f"cannot include {source}: no such file")
        return ""
    text = path.read_text()
    return _LINK.sub(lambda m: m.group(1) + _site_target(source, m.group(2)) + m.group(3), text)
