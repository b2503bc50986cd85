"""The reference of the public names, the signals and the metrics, from the code.

* Public names: `leasing.__all__`, each with its signature and docstring; a
  class also with its fields and its public methods and properties.
* Signals: the `Signal` objects of `leasing.signals`, explained by the table
  in that module's docstring (a signal missing from it is a build warning).
* Metrics: the metric families `leasing.metrics.LeasingCollector` declares.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from .text import code, docstring, docstring_text, escape, rst_simple_table, table, warn

WIDTH = 88


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, typing.ForwardRef):  # a NamedTuple's string annotation
        annotation = annotation.__forward_arg__
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return f": {text}"


def _default_text(default: Any) -> str:
    if default is inspect.Parameter.empty:
        return ""
    text = repr(default)
    return " = ..." if " at 0x" in text else f" = {text}"  # a sentinel object


def _parameters(signature: inspect.Signature) -> list[str]:
    """Each parameter as written in a `def`, with the `*` before keyword-only ones."""
    out: list[str] = []
    star_written = False
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            star_written = True
            out.append(f"*{param.name}{_annotation(param.annotation)}")
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            out.append(f"**{param.name}{_annotation(param.annotation)}")
            continue
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not star_written:
            out.append("*")
            star_written = True
        out.append(f"{param.name}{_annotation(param.annotation)}{_default_text(param.default)}")
    if out[:1] in (["self"], ["cls"]):
        out = out[1:]
    return out


def _signature(name: str, obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = _parameters(signature)
    one_line = f"{name}({', '.join(params)})"
    if len(one_line) <= WIDTH:
        return one_line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + ")"


def _kind(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return "exception"
    if inspect.isclass(obj):
        return "class"
    return "function"


def _members(cls: type) -> list[tuple[str, Any]]:
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            members.append((name, value))
    return members


def _render_class(name: str, cls: type) -> str:
    out = []
    for member, value in _members(cls):
        out.append(f"#### {name}.{member}\n\n")
        if isinstance(value, property):
            out.append("*A property.*\n\n")
            doc = docstring(value.fget)
        else:
            out.append(f"```python\n{_signature(member, value)}\n```\n\n")
            doc = docstring(value)
        if doc:
            out.append(doc + "\n")
    return "".join(out)


def render_public_names() -> str:
    import leasing

    sections: dict[str, list[str]] = {"function": [], "class": [], "exception": [], "module": []}
    for name in leasing.__all__:
        obj = getattr(leasing, name)
        kind = _kind(obj)
        out = [f"### {name}\n\n"]
        if kind == "module":
            out.append(f"The module `{obj.__name__}`: see [Signals](signals.md).\n\n")
        else:
            if kind == "exception":
                bases = ", ".join(b.__name__ for b in obj.__bases__)
                out.append(f"```python\nclass {name}({bases})\n```\n\n")
            else:
                prefix = "class " if kind == "class" else ""
                out.append(f"```python\n{prefix}{_signature(name, obj)}\n```\n\n")
            doc = docstring(obj)
            if not doc:
                warn(f"leasing.{name} has no docstring")
            out.append(doc + "\n")
            if kind == "class":
                out.append(_render_class(name, obj))
        sections[kind].append("".join(out))
    titles = {
        "function": "Functions",
        "class": "Classes",
        "exception": "Exceptions",
        "module": "Modules",
    }
    parts = []
    for kind, entries in sections.items():
        if entries:
            parts.append(f"## {titles[kind]}\n\n" + "".join(entries))
    return "".join(parts)


def render_signals() -> str:
    from django.dispatch import Signal

    from leasing import signals

    defined = [n for n, v in vars(signals).items() if isinstance(v, Signal)]
    before, rows, after = rst_simple_table(signals.__doc__ or "")
    explained = {row[0]: row for row in rows}
    for name in defined:
        if name not in explained:
            warn(f"signal {name} is not in the table of leasing/signals.py's docstring")
    for name in explained:
        if name not in defined:
            warn(f"leasing/signals.py's docstring explains {name}, which is not a Signal there")
    body = [
        [code(f"leasing.signals.{row[0]}"), escape(row[1]), escape(row[2])]
        for row in rows
        if row[0] in defined
    ]
    text = docstring_text(before)
    text += "\n" + table(["signal", "sent when", "extra arguments"], body) + "\n"
    if after:
        text += "\n" + docstring_text(after)
    return text


def render_metrics() -> str:
    from leasing.metrics import LeasingCollector

    try:
        families = LeasingCollector._families()
    except Exception as exc:  # prometheus-client missing: the build says so
        warn(f"cannot list the metrics ({exc}); install the `metrics` extra")
        return ""
    rows = []
    for family in families.values():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = getattr(family, "_labelnames", ()) or ()
        shown = name + ("{" + ",".join(labels) + "}" if labels else "")
        rows.append([code(shown), family.type, escape(family.documentation)])
    return table(["metric", "type", "what it counts"], rows) + "\n"
