"""The reference of the management commands, from their argparse parsers.

Every module of `leasing/management/commands/` is loaded as Django loads it,
its parser built with `create_parser()`, and each option it adds (Django's
common options left out) rendered with its argument, default and help text.
"""

from __future__ import annotations

import argparse
import pkgutil
from typing import Any

from .text import code, escape, table, warn

# The long-running commands first, in the order a deployment starts them.
FIRST = ("runworker", "recoverysweep", "runscheduler")


def command_names() -> list[str]:
    import leasing.management.commands as package

    found = sorted(m.name for m in pkgutil.iter_modules(package.__path__))
    return [n for n in FIRST if n in found] + [n for n in found if n not in FIRST]


def _parser(name: str) -> argparse.ArgumentParser:
    from django.core.management import load_command_class

    command = load_command_class("leasing", name)
    return command.create_parser("manage.py", name)


def _common_dests() -> set[str]:
    from django.core.management.base import BaseCommand

    return {a.dest for a in BaseCommand().create_parser("manage.py", "x")._actions}


def _argument(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return " \\| ".join(code(str(c)) for c in action.choices)
    return code(action.metavar or action.dest.upper())


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return code(str(action.default))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter: Any = parser._get_formatter()
    text = formatter._expand_help(action) if action.help else ""
    if not text:
        warn(f"option {'/'.join(action.option_strings)} has no help text")
    notes = []
    if action.required:
        notes.append("Required.")
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text.lower():
        notes.append("Repeatable.")
    return " ".join([escape(text), *notes]).strip()


def _groups(parser: argparse.ArgumentParser) -> list[str]:
    lines = []
    for group in parser._mutually_exclusive_groups:
        flags = ", ".join(code(a.option_strings[0]) for a in group._group_actions)
        which = "Exactly one" if group.required else "At most one"
        lines.append(f"{which} of {flags}.")
    return lines


def render_command(name: str) -> str:
    from django.core.management import load_command_class

    command = load_command_class("leasing", name)
    parser = _parser(name)
    common = _common_dests()
    rows = []
    for action in parser._actions:
        if action.dest in common or not action.option_strings:
            continue
        flags = ", ".join(code(s) for s in action.option_strings)
        rows.append([flags, _argument(action), _default(action), _help(parser, action)])
    out = [f"## {name}\n\n", f"```\npython manage.py {name} [options]\n```\n\n"]
    out.append(escape(" ".join(str(command.help).split())) + "\n\n")
    if rows:
        out.append(table(["option", "argument", "default", "what it does"], rows) + "\n\n")
    for line in _groups(parser):
        out.append(line + "\n\n")
    return "".join(out)


def render_commands() -> str:
    names = command_names()
    if not names:
        warn("no management command found in leasing/management/commands")
    common = sorted(
        s
        for a in _parser(names[0])._actions
        if a.dest in _common_dests()
        for s in a.option_strings
        if s.startswith("--")
    )
    intro = (
        "Every command also takes Django's common options ("
        + ", ".join(code(s) for s in common)
        + "); `-v 0` / `-v 2` change how much the long-running commands log.\n\n"
    )
    return intro + "".join(render_command(name) for name in names)
