"""What the leasing management commands share: argparse validators and one-line errors.

SPEC §14: a command given bad options exits non-zero with one line saying what
is wrong, so the parser prints `<command>: error: <what>` without the usage
block, and `CommandError`s raised while validating look the same.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text!r}")
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


class OneLineErrorParser(CommandParser):
    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            sys.exit(2)
        raise CommandError(f"Error: {message}")


class LeasingCommand(BaseCommand):
    """A command whose option errors are one line and exit non-zero.

    Django's automatic system checks would print a block of warnings before
    any error; instead the leasing checks run in `handle()` via
    `run_leasing_checks()`: errors become one-line `CommandError`s and warnings
    go to the log.
    """

    requires_system_checks: list[str] = []

    def run_leasing_checks(self) -> None:
        from django.core import checks

        for message in checks.run_checks(tags=["leasing"]):
            text = f"{message.id}: {message.msg}"
            if message.is_serious():
                raise CommandError(text)
            logging.getLogger("leasing").warning(text)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # BaseCommand builds a plain CommandParser; the subclass only changes error().
        parser.__class__ = OneLineErrorParser
        return parser
