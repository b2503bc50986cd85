"""`manage.py ha_console_probe`: fetch console pages and say which database served each.

Prints one JSON object: for each page, its HTTP status, the tables the queries
sent to each database alias read and wrote, whether the page mentions
replication lag, the replica lag the dashboard shows (its `data-lag-*`
attributes) and the `/metrics` samples of work items and of the replica. Used
by the read-replica test. With `--force-release ITEM` it then force-releases
that item through the work item list's action (confirmation page, then
confirm) and reports the same for both requests and the messages shown.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.core.management.base import BaseCommand, CommandParser
from django.db import connections
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

TABLE = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?([a-z_]+)"?', re.IGNORECASE)
WRITTEN = re.compile(r'^\s*(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+"?([a-z_]+)"?', re.IGNORECASE)
LAG = re.compile(r'data-(lag-seconds|lag-bytes|replay-paused|replica-alias)="([^"]*)"')
SAMPLE = re.compile(r"^(leasing_(?:work_items|read_replica_\w+))(\{[^}]*\})? (\S+)$", re.MULTILINE)
HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')


def captured(client_call: Callable[[], HttpResponse]) -> tuple[HttpResponse, dict[str, Any]]:
    """Run one request; the tables each alias's queries read and wrote."""
    captures = {alias: CaptureQueriesContext(connections[alias]) for alias in connections}
    for capture in captures.values():
        capture.__enter__()
    try:
        response = client_call()
    finally:
        for capture in captures.values():
            capture.__exit__(None, None, None)
    queries = {
        alias: sorted({t for q in capture.captured_queries for t in TABLE.findall(q["sql"])})
        for alias, capture in captures.items()
    }
    writes = {
        alias: sorted({t for q in capture.captured_queries for t in WRITTEN.findall(q["sql"])})
        for alias, capture in captures.items()
    }
    return response, {"status": response.status_code, "queries": queries, "writes": writes}


class Command(BaseCommand):
    help = "Fetch the console pages and report which database alias served their queries."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--item", help="A work item id for the change page.")
        parser.add_argument("--task", help="A task id for the timeline page.")
        parser.add_argument("--force-release", help="Then force-release this work item.")

    def handle(self, *args: Any, **options: Any) -> None:
        user, _ = get_user_model().objects.get_or_create(
            username="ha-probe", defaults={"is_staff": True, "is_superuser": True}
        )
        client = Client()
        client.force_login(user)
        pages = {
            "dashboard": reverse("admin:leasing_workitem_dashboard"),
            "changelist": reverse("admin:leasing_workitem_changelist"),
            "history": reverse("admin:leasing_workitem_history"),
            "metrics": reverse("leasing:metrics"),
        }
        if options["item"]:
            pages["change"] = reverse("admin:leasing_workitem_change", args=[options["item"]])
        if options["task"]:
            pages["timeline"] = reverse("admin:leasing_workitem_timeline", args=[options["task"]])
        report: dict[str, Any] = {}
        for name, url in pages.items():
            response, seen = captured(lambda url=url: client.get(url))
            body = response.content.decode(errors="replace")
            seen["mentions_lag"] = "lag" in body.lower()
            if name == "dashboard":
                seen["lag"] = dict(LAG.findall(body))
            if name == "metrics":
                samples = SAMPLE.findall(body)
                seen["samples"] = {f"{m}{labels or ''}": float(v) for m, labels, v in samples}
            report[name] = seen
        if options["force_release"]:
            report["force_release"] = self.force_release(client, options["force_release"])
        self.stdout.write(json.dumps(report))

    def force_release(self, client: Client, item: str) -> dict[str, Any]:
        """The list's force-release action on `item`: the confirmation page, then confirm."""
        url = reverse("admin:leasing_workitem_changelist")
        ask = {"action": "force_release_selected", "index": "0", "_selected_action": [item]}
        page, shown = captured(lambda: client.post(url, ask))
        form = page.content.decode(errors="replace")
        fields: dict[str, Any] = {}
        for name, value in HIDDEN.findall(form):
            fields.setdefault(name, []).append(html.unescape(value))
        fields["reason"] = "ha probe: force-release through the console"
        done, confirmed = captured(lambda: client.post(url, fields))
        return {
            "confirmation": shown,
            "confirmation_lists_item": f'value="{item}"' in form,
            "confirm": confirmed,
            "messages": [str(m) for m in get_messages(done.wsgi_request)],
        }
