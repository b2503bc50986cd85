"""MkDocs hook: the parts of the site that come from the code (see mkdocs.yml, `hooks:`).

A page asks for generated text with a marker line, replaced when it is built:

    <!-- generated: settings -->       LEASING settings (leasing/conf.py)
    <!-- generated: checks -->         system checks (leasing/checks.py)
    <!-- generated: handler-options --> @handler's options (leasing/handlers.py)
    <!-- generated: commands -->       management commands (their argparse parsers)
    <!-- generated: public-names -->   leasing.__all__ with signatures and docstrings
    <!-- generated: signals -->        leasing/signals.py
    <!-- generated: metrics -->        the families of leasing/metrics.py's collector
    <!-- generated: monitoring-sql --> the monitoring SQL the test suite runs verbatim
    <!-- generated: transitions -->    the state machine's transitions (leasing/transitions.py)
    <!-- generated: guards -->         each feature's rule on them (leasing/transitions.py)
    <!-- include: BENCHMARKS.md -->    a repository file, its links rewritten for the site

Django is set up once with the project's settings (project/settings.py), as
`manage.py` would, so the generated text is what the installed code says.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from docgen import api, commands, include, machine, settings  # noqa: E402
from docgen.text import warn  # noqa: E402

_MARKER = re.compile(r"^<!-- (generated|include): ([\w./-]+) -->$", re.MULTILINE)


def _monitoring_sql() -> str:
    try:
        from tests.support import spec_sql
    except ImportError as exc:
        warn(f"the monitoring SQL (tests/support/spec_sql.py) cannot be imported: {exc}")
        return ""
    queries = (spec_sql.ACTIVE_AND_STALE, spec_sql.RETRY_DISTRIBUTION, spec_sql.TIMELINE)
    return "```sql\n" + "\n".join(q.strip() + "\n" for q in queries) + "```\n"


GENERATORS: dict[str, Callable[[str], str]] = {
    "settings": lambda page: settings.render_settings(),
    "checks": lambda page: settings.render_checks(),
    "handler-options": settings.render_handler_options,
    "commands": lambda page: commands.render_commands(),
    "public-names": lambda page: api.render_public_names(),
    "signals": lambda page: api.render_signals(),
    "metrics": lambda page: api.render_metrics(),
    "monitoring-sql": lambda page: _monitoring_sql(),
    "transitions": lambda page: machine.render_transitions(),
    "guards": lambda page: machine.render_guards(),
}


def on_config(config: Any) -> Any:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        kind, name = match.groups()
        if kind == "include":
            return include.include(name)
        generator = GENERATORS.get(name)
        if generator is None:
            warn(f"{page.file.src_uri} asks for unknown generated text {name!r}")
            return match.group(0)
        return generator(markdown)

    return _MARKER.sub(replace, markdown)
