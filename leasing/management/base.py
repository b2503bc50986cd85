"""What the leasing management commands share: argparse validators, one-line
errors and the default logging of the long-running commands.

A command given bad options exits non-zero with one line saying what is
wrong, so the parser prints `<command>: error: <what>` without the usage
block, and `CommandError`s raised while validating look the same. A flag a
command no longer takes (its `removed_flags`) is answered with what replaced
it, usually the LEASING setting to set instead.

Logging: when the project's LOGGING says nothing about the `leasing` loggers
(and the root logger has no handler), `runworker` and `recoverysweep` log to
stderr themselves: INFO by default (start and stop, the periodic summary,
every retry, failure and sweep pass with findings), DEBUG with `-v 2` or more
(adds one line per completed item), WARNING with `-v 0`. A project that
configures the `leasing` logger keeps full control: `-v` then changes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping
from typing import IO, Any, ClassVar, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


LOGGER_NAME = "leasing"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def verbosity_level(verbosity: int) -> int:
    """The log level of the default set-up for Django's `-v` option."""
    if verbosity <= 0:
        return logging.WARNING
    if verbosity == 1:
        return logging.INFO
    return logging.DEBUG


def project_configures_leasing_logging() -> bool:
    """True when LOGGING (or any other set-up) already decides where leasing logs go."""
    if logging.getLogger().handlers:
        return True
    for name, logger in logging.Logger.manager.loggerDict.items():
        if name != LOGGER_NAME and not name.startswith(LOGGER_NAME + "."):
            continue
        if isinstance(logger, logging.Logger) and (
            logger.handlers or logger.level != logging.NOTSET or not logger.propagate
        ):
            return True
    return False


@contextlib.contextmanager
def default_logging(verbosity: int, stream: IO[str] | None = None) -> Iterator[bool]:
    """Log `leasing.*` to `stream` (stderr) while the block runs, unless the project does.

    Yields whether the default set-up is in force. Everything is put back
    afterwards, so a `call_command()` leaves no handler behind.
    """
    if project_configures_leasing_logging():
        yield False
        return
    logger = logging.getLogger(LOGGER_NAME)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(verbosity_level(verbosity))
    try:
        yield True
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


UNRECOGNIZED = "unrecognized arguments: "


def removed_flag_message(message: str, removed_flags: Mapping[str, str]) -> str:
    """argparse's "unrecognized arguments" error, saying what replaced each removed flag."""
    if not message.startswith(UNRECOGNIZED):
        return message
    words = message.removeprefix(UNRECOGNIZED).split()
    hints = []
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in removed_flags:
            hints.append(f"{flag} was removed: {removed_flags[flag].rstrip('.')}")
    if not hints:
        return message
    unknown = [
        word
        for word in words
        if word.startswith("-")
        and word.split("=", 1)[0] not in removed_flags
        and not _is_number(word)
    ]
    if unknown:
        hints.append(UNRECOGNIZED + " ".join(unknown))
    return "; ".join(hints)


def _is_number(word: str) -> bool:
    """A value such as -1 (argparse lists it with the flag it followed)."""
    try:
        float(word)
    except ValueError:
        return False
    return True


class OneLineErrorParser(CommandParser):
    removed_flags: Mapping[str, str] = {}

    def error(self, message: str) -> NoReturn:
        message = removed_flag_message(message, self.removed_flags)
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
    # Flags this command took in earlier releases -> what to do instead (the error says it).
    removed_flags: ClassVar[Mapping[str, str]] = {}

    def default_logging(self, verbosity: int) -> contextlib.AbstractContextManager[bool]:
        """The default logging of the long-running commands (see the module docstring)."""
        # The raw stream: Django's wrapper would colour every line as an error.
        stream = getattr(self.stderr, "_out", sys.stderr)
        return default_logging(verbosity, stream)

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
        assert isinstance(parser, OneLineErrorParser)  # for the type checker: it is one now
        parser.removed_flags = self.removed_flags
        return parser
