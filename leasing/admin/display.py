"""How the admin pages show leasing values: badges, ages, payloads and links."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Model
from django.urls import reverse
from django.utils.dateformat import format as format_date
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

from ..console.durations import EMPTY, humanize_seconds
from ..console.leases import stale_after
from ..models import Worker, WorkItem, WorkItemStatus

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

PAYLOAD_PERMISSION = "leasing.view_payload"
# Every time the console shows, to the second (Django's default format stops at minutes).
TIME_FORMAT = "Y-m-d H:i:s"


def timestamp(value: datetime | None) -> str:
    """A time in the site's time zone, to the second; `—` for None."""
    if value is None:
        return EMPTY
    return format_date(localtime(value), TIME_FORMAT)


def time_column(field: str, description: str) -> Callable[[Any, Any], str]:
    """An admin column (or read-only field) showing `field` to the second."""

    @admin.display(description=description, ordering=field)
    def column(modeladmin: Any, obj: Any) -> str:
        return timestamp(getattr(obj, field))

    column.__name__ = f"{field}_to_the_second"
    return column


def payloads_visible(user: Any) -> bool:
    """Only `leasing.view_payload` holders see input/output data and snapshots."""
    return bool(user.has_perm(PAYLOAD_PERMISSION))


# --- error text: one rule for every page, list, fragment and tooltip ----------------------------
#
# An error message or a traceback quotes the data it failed on (an account
# name, a card number), so it is payload: shown only to `leasing.view_payload`
# holders. Every place that renders error text asks `errors_visible` (or
# `error_text`); the exception type alone (`KeyError`) is not error text.

ERROR_HIDDEN = (
    "Error text hidden: it needs the “Can view work item and checkpoint payloads” permission."
)


def errors_visible(user: Any) -> bool:
    """Whether `user` may read error messages and tracebacks (the payload permission)."""
    return payloads_visible(user)


def error_text(user: Any, text: str | None) -> str | None:
    """`text` for a user allowed to read it; `ERROR_HIDDEN` (or None: no text) otherwise."""
    if not text:
        return None
    return text if errors_visible(user) else ERROR_HIDDEN


def hide_error_fields(fieldsets: list[Any], user: Any) -> list[Any]:
    """The item page's fieldsets with `error_message` replaced for users who may not read it."""
    if errors_visible(user):
        return fieldsets
    return [
        (name, {**options, "fields": tuple(
            "error_message_hidden" if f == "error_message" else f for f in options["fields"]
        )})
        for name, options in fieldsets
    ]  # fmt: skip


@admin.display(description="error message")
def error_message_hidden(model_admin: Any, obj: WorkItem) -> SafeString | str:
    """The item page's error field for users without the payload permission."""
    if not obj.error_message:
        return EMPTY
    return format_html('<span class="leasing-redacted">{}</span>', ERROR_HIDDEN)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


# How deep `multiline_texts` looks into a payload, and how many texts it shows.
TEXT_DEPTH = 4
TEXTS_SHOWN = 5


def multiline_texts(value: Any) -> list[tuple[str, str]]:
    """`(path, text)` of the string values of a payload that span several lines.

    A traceback stored in a snapshot is one JSON string: in the JSON it reads
    as a single line full of `\\n`. Shown again on its own, it reads as it was
    printed. Paths are `key.key[index]`; at most `TEXTS_SHOWN`, breadth first.
    """
    found: list[tuple[str, str]] = []
    level: list[tuple[str, Any]] = [("", value)]
    for _ in range(TEXT_DEPTH + 1):
        following: list[tuple[str, Any]] = []
        for path, item in level:
            if isinstance(item, str) and "\n" in item.strip():
                found.append((path or "value", item))
            elif isinstance(item, dict):
                following += [(f"{path}.{k}" if path else str(k), v) for k, v in item.items()]
            elif isinstance(item, list):
                following += [(f"{path}[{i}]", v) for i, v in enumerate(item)]
        if len(found) >= TEXTS_SHOWN or not following:
            break
        level = following
    return found[:TEXTS_SHOWN]


def payload_html(value: Any) -> SafeString:
    """A payload as indented JSON in a <pre> block (escaped), then its multi-line texts."""
    if value is None:
        return format_html('<span class="quiet">{}</span>', EMPTY)
    texts = format_html_join(
        "",
        '<p class="leasing-text-path"><strong>{}</strong></p><pre class="leasing-text">{}</pre>',
        multiline_texts(value),
    )
    return format_html('<pre class="leasing-json">{}</pre>{}', pretty_json(value), texts)


def payload_column(field: str, description: str) -> Callable[[Any, Model], SafeString]:
    """A read-only ModelAdmin column showing the JSON of `field`."""

    @admin.display(description=description)
    def column(model_admin: Any, obj: Model) -> SafeString:
        return payload_html(getattr(obj, field))

    return column


def badge(kind: str, value: str, label: str) -> SafeString:
    """A coloured badge: `kind` is status, worker or cp (checkpoint type)."""
    return format_html('<span class="leasing-badge leasing-{}-{}">{}</span>', kind, value, label)


def ago(seconds: float) -> str:
    return f"{humanize_seconds(max(0.0, seconds))} ago"


class ChangeUrls:
    """Admin change URLs of one model's objects, without one `reverse()` per link."""

    MARKER = "__leasing_object__"

    def __init__(self, site: str, model: str = "workitem") -> None:
        self._template = reverse(f"{site}:leasing_{model}_change", args=[self.MARKER])

    def __call__(self, pk: str) -> str:
        return self._template.replace(self.MARKER, quote(pk))


def work_item_link(site: str, work_item_id: str | None) -> SafeString | str:
    if not work_item_id:
        return EMPTY
    url = reverse(f"{site}:leasing_workitem_change", args=[quote(work_item_id)])
    return format_html('<a href="{}">{}</a>', url, work_item_id)


def timeline_link(site: str, task_id: str, title: str = "") -> SafeString:
    url = reverse(f"{site}:leasing_workitem_timeline", args=[task_id])
    if title:
        return format_html('<a href="{}" title="{}">{}</a>', url, title, task_id)
    return format_html('<a href="{}">{}</a>', url, task_id)


# --- lease columns of a work item (annotated with `db_now`, the database clock) ---------------


class DbClock(TypedDict):
    """The admin querysets' `db_now` annotation: the database clock."""

    db_now: datetime


type ClockedWorkItem = WithAnnotations[WorkItem, DbClock]
type ClockedWorker = WithAnnotations[Worker, DbClock]


def lease_remaining(item: ClockedWorkItem) -> SafeString | str:
    if item.status != WorkItemStatus.IN_PROGRESS or item.lease_expires_at is None:
        return EMPTY
    remaining = (item.lease_expires_at - item.db_now).total_seconds()
    if remaining < 0:
        return format_html(
            '<span class="leasing-expired" title="Lease expired; the recovery sweep will '
            're-queue or fail it">expired {}</span>',
            ago(-remaining),
        )
    return humanize_seconds(remaining)


def heartbeat_age(item: ClockedWorkItem) -> SafeString | str:
    if item.heartbeat_at is None or item.status != WorkItemStatus.IN_PROGRESS:
        return EMPTY
    age = (item.db_now - item.heartbeat_at).total_seconds()
    threshold = stale_after(item.work_type)  # its type's, as the dashboard counts it
    if age > threshold:
        return format_html(
            '<span class="leasing-stale" title="No heartbeat for more than {}">{} (stale)</span>',
            humanize_seconds(threshold),
            ago(age),
        )
    return ago(age)


def last_progress(item: ClockedWorkItem) -> str:
    if item.progress_at is None:
        return EMPTY
    return ago((item.db_now - item.progress_at).total_seconds())
