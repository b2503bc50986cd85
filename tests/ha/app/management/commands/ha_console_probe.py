"""`manage.py ha_console_probe`: fetch console pages and say which database served each.

Prints one JSON object: for each page, its HTTP status, the number of queries
sent to each database alias and the tables they read, and whether the page
mentions replication lag. Used by the read-replica test; the pages are the
console's as of the restructuring (the lead adjusts the list when merging).
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

TABLE = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?([a-z_]+)"?', re.IGNORECASE)


class Command(BaseCommand):
    help = "Fetch the console pages and report which database alias served their queries."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--item", help="A work item id for the change page.")
        parser.add_argument("--task", help="A task id for the timeline page.")

    def handle(self, *args: Any, **options: Any) -> None:
        user, _ = get_user_model().objects.get_or_create(
            username="ha-probe", defaults={"is_staff": True, "is_superuser": True}
        )
        client = Client()
        client.force_login(user)
        pages = {
            "dashboard": reverse("admin:leasing_workitem_dashboard"),
            "changelist": reverse("admin:leasing_workitem_changelist"),
            "metrics": reverse("leasing:metrics"),
        }
        if options["item"]:
            pages["change"] = reverse("admin:leasing_workitem_change", args=[options["item"]])
        if options["task"]:
            pages["timeline"] = reverse("admin:leasing_workitem_timeline", args=[options["task"]])
        report = {}
        for name, url in pages.items():
            captures = {alias: CaptureQueriesContext(connections[alias]) for alias in connections}
            for capture in captures.values():
                capture.__enter__()
            try:
                response = client.get(url)
            finally:
                for capture in captures.values():
                    capture.__exit__(None, None, None)
            body = response.content.decode(errors="replace")
            report[name] = {
                "status": response.status_code,
                "mentions_lag": "lag" in body.lower(),
                "queries": {
                    alias: sorted(
                        {t for q in capture.captured_queries for t in TABLE.findall(q["sql"])}
                    )
                    for alias, capture in captures.items()
                },
            }
        self.stdout.write(json.dumps(report))
