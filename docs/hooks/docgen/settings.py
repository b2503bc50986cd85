"""The reference of `settings.LEASING`, the system checks and the handler options, from the code.

* Settings: the fields of `leasing.conf.LeasingSettings`, grouped by the plain
  `# Group` comments of the class body, each explained by the `#:` comment
  above it; a field without one is a build warning (an error under --strict).
* System checks: the table of `leasing/checks.py`'s docstring, against every
  `id="leasing.X000"` in the app's code.
* Handler options: the keyword parameters of `leasing.handler` (type and
  default); their explanations are the `### option` sections of the page,
  checked against the parameters both ways.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any

from .text import code, escape, table, warn

_FIELD = re.compile(r"^    (\w+): (.+?) = ")
_GROUP = re.compile(r"^    # (\S.*)$")
_DOC = re.compile(r"^    #: ?(.*)$")


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return code(repr(value))


def documented_fields(cls: type) -> list[tuple[str, str, str]]:
    """(group, field name, its `#:` text) in the order of the class body.

    A plain one-line `# Heading` comment starts a group; the `#:` lines right
    above a field explain it.
    """
    found: list[tuple[str, str, str]] = []
    group, doc = "General", []
    for line in inspect.getsource(cls).splitlines():
        if match := _DOC.match(line):
            doc.append(match.group(1))
        elif match := _GROUP.match(line):
            group, doc = match.group(1), []
        elif match := _FIELD.match(line):
            found.append((group, match.group(1), " ".join(doc).strip()))
            doc = []
        else:
            doc = []
    return found


def render_settings() -> str:
    from leasing.conf import LeasingSettings

    fields = {f.name: f for f in dataclasses.fields(LeasingSettings)}
    documented = documented_fields(LeasingSettings)
    seen = {name for _, name, _ in documented}
    for name in sorted(set(fields) - seen):
        warn(f"LeasingSettings.{name} was not found in the class body's source")
    groups: dict[str, list[list[str]]] = {}
    for group, name, doc in documented:
        if name not in fields:
            continue
        if not doc:
            warn(f"LEASING[{name.upper()!r}] has no `#:` comment in leasing/conf.py")
        key = f'<a id="{name}"></a>{code(name.upper())}'
        groups.setdefault(group, []).append([key, _shown(_default(fields[name])), escape(doc)])
    out = []
    for group, rows in groups.items():
        out.append(f"### {group}\n\n")
        out.append(table(["key", "default", "what it is for"], rows) + "\n\n")
    return "".join(out)


def render_checks() -> str:
    import leasing
    from leasing import checks

    listed: dict[str, str] = {}
    last = None
    for line in (checks.__doc__ or "").splitlines():
        if match := re.match(r"^([EW]\d{3})\s+(.+)$", line):
            last = match.group(1)
            listed[last] = match.group(2)
        elif last is not None and line.startswith("      ") and line.strip():
            listed[last] += " " + line.strip()  # an entry's continuation line
        else:
            last = None
    root = Path(leasing.__file__).parent
    used = set()
    for path in root.rglob("*.py"):
        used |= set(re.findall(r'id="leasing\.([EW]\d{3})"', path.read_text()))
    for missing in sorted(used - set(listed)):
        warn(f"check leasing.{missing} is raised but not listed in leasing/checks.py's docstring")
    for stale in sorted(set(listed) - used):
        warn(f"check leasing.{stale} is listed in leasing/checks.py's docstring but never raised")
    rows = []
    for check_id in sorted(listed, key=lambda c: (c[0] != "E", c)):
        level = "error" if check_id.startswith("E") else "warning"
        rows.append([code(f"leasing.{check_id}"), level, escape(listed[check_id])])
    return table(["id", "level", "raised when"], rows) + "\n"


def _type_text(annotation: Any) -> str:
    """A type for a reader: a Literal as its values, `X | None` kept."""
    if isinstance(annotation, str):
        return code(annotation)
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(code(repr(a)) for a in args)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return " \\| ".join([*(_type_text(a) for a in rest), code("None")])
    return code(getattr(annotation, "__name__", str(annotation)))


def handler_parameters() -> list[inspect.Parameter]:
    from leasing import handler

    return [
        p
        for p in inspect.signature(handler).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def render_handler_options(page_markdown: str) -> str:
    """The options table; warns when the page's `### option` sections and the code disagree."""
    params = handler_parameters()
    sections = set(re.findall(r"^### `?(\w+)`?\s*$", page_markdown, re.MULTILINE))
    names = {p.name for p in params}
    for name in sorted(names - sections):
        warn(f"handler option {name!r} has no '### {name}' section in reference/handlers.md")
    for name in sorted(sections - names):
        warn(f"reference/handlers.md explains {name!r}, which leasing.handler() does not take")
    from leasing import WorkContext, handler

    try:  # the handlers module names WorkContext for type checkers only
        hints = typing.get_type_hints(handler, localns={"WorkContext": WorkContext})
    except Exception:  # an annotation that does not resolve: show it as written
        hints = {}
    rows = []
    for p in params:
        default = "" if p.default is inspect.Parameter.empty else _shown(p.default)
        kind = _type_text(hints.get(p.name, p.annotation))
        rows.append([f"[{code(p.name)}](#{p.name})", kind, default])
    return table(["option", "type", "default"], rows) + "\n"
