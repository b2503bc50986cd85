"""The management commands' flags: few, each explained, and a removed one answered with
what replaced it (usually the LEASING setting) in one line, never a traceback."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import BaseCommand, CommandError

from leasing.conf import LeasingSettings

pytestmark = pytest.mark.django_db

COMMANDS = ("runworker", "recoverysweep", "runscheduler", "purgeitems", "pause", "cancel")
# What each command needs to get past argparse's own checks to the unknown flags.
REQUIRED = {"purgeitems": ["--older-than", "30d"], "cancel": ["x", "--reason", "r"]}


def own_flags(name: str) -> list[tuple[str, str]]:
    """(flag, help text) of each option the command adds to Django's common ones."""
    common = {a.dest for a in BaseCommand().create_parser("manage.py", "x")._actions}
    parser = load_command_class("leasing", name).create_parser("manage.py", name)
    return [
        (action.option_strings[0], action.help or "")
        for action in parser._actions
        if action.option_strings and action.dest not in common
    ]


def removed(name: str) -> dict[str, str]:
    return dict(load_command_class("leasing", name).removed_flags)


def test_the_commands_take_at_most_twenty_one_flags_each_with_its_reason():
    flags = [(name, flag, text) for name in COMMANDS for flag, text in own_flags(name)]
    # 21 with runworker --database: a Tasks backend's DATABASE may name another alias.
    assert len(flags) <= 21, [f"{name} {flag}" for name, flag, _ in flags]
    for name, flag, text in flags:
        assert len(text.split()) >= 6, f"{name} {flag}: {text!r} says too little"


def test_no_removed_flag_is_still_taken():
    for name in COMMANDS:
        assert not set(removed(name)) & {flag for flag, _ in own_flags(name)}, name


def test_each_named_setting_exists():
    known = {name.upper() for name in LeasingSettings.__dataclass_fields__}
    for name in COMMANDS:
        for hint in removed(name).values():
            for setting in re.findall(r"LEASING\['(\w+)'\]", hint):
                assert setting in known, (name, setting)


@pytest.mark.parametrize(
    ("name", "flag"), [(name, flag) for name in COMMANDS for flag in removed(name)]
)
def test_a_removed_flag_is_one_line_naming_what_replaced_it(name, flag):
    with pytest.raises(CommandError) as info:
        call_command(name, *REQUIRED.get(name, []), flag, "1", stdout=StringIO())
    message = str(info.value)
    assert message == f"Error: {flag} was removed: {removed(name)[flag].rstrip('.')}"
    assert "\n" not in message


def test_an_unknown_flag_beside_a_removed_one_is_named_too():
    with pytest.raises(CommandError) as info:
        call_command("recoverysweep", "--once", "--interval", "5", "--bogus")
    assert str(info.value) == (
        "Error: --interval was removed: set LEASING['SWEEP_INTERVAL']; "
        "unrecognized arguments: --bogus"
    )
