"""Filters of the console templates: `{% load leasing_console %}`."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.dateformat import format as format_date
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

from ..admin.display import badge
from ..console.durations import humanize_seconds

register = template.Library()


@register.filter
def duration(seconds: Any) -> str:
    """`151` -> `2 min 31 s`; `—` for None or anything that is not a number."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return humanize_seconds(None)
    return humanize_seconds(seconds)


@register.filter
def number(value: Any) -> str:
    """`78000` -> `78,000`: the one number format of the console; `—` for None.

    Anything not a number (a label, a dash) is shown as it is.
    """
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


@register.filter
def percent(fraction: Any) -> str:
    """`0.0234` -> `2.3 %`; `—` for None."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        return "—"
    return f"{100 * fraction:.1f} %"


# The dashboard's process tables render these cells in Python: with many workers
# and lease links, an `{% include %}` per row and a loop per link were a large
# share of the page's time.


@register.simple_tag
def leasing_liveness(process: Any) -> SafeString:
    """Status and liveness of one process (a console ProcessInfo): red "silent …"
    when a running process was not seen for three of its own intervals."""
    alive = process.liveness
    seen = format_date(localtime(process.last_seen_at), "Y-m-d H:i:s")
    beats = format_html(
        '<span class="leasing-sub">beats every {}; silent after {}</span>',
        humanize_seconds(alive.interval_seconds),
        humanize_seconds(alive.limit_seconds),
    )
    if alive.silent:
        return format_html(
            '{} <strong class="leasing-bad-text leasing-nowrap" title="last seen {}">{}</strong>{}',
            badge("worker", "lost", "silent"),
            seen,
            alive.text,
            beats,
        )
    return format_html(
        '{} <span class="leasing-nowrap" title="last seen {}">{}</span>{}',
        badge("worker", process.status, process.status),
        seen,
        alive.text,
        beats,
    )


@register.simple_tag
def leasing_lease_links(row: dict[str, Any]) -> SafeString:
    """A process row's lease links, then "all N…" when the row shows only some."""
    links = format_html_join("", '<a href="{}">{}</a>', ((url, pk) for pk, url in row["leases"]))
    if row["more_url"] is None:
        return links
    return format_html('{}<a href="{}">all {}…</a>', links, row["more_url"], row["lease_count"])


@register.simple_tag
def leasing_tools_in_content() -> bool:
    """Whether the admin's base template renders `object-tools` inside `content`.

    Django 6.0 does, so a page that overrides `content` must render its tools
    itself; Django 6.1 renders them beside the title, outside `content`.
    """
    import django

    return django.VERSION < (6, 1)


@register.simple_tag(takes_context=True)
def leasing_nonce_attr(context: Any) -> str:
    """` nonce="..."` for the page's CSP nonce, if it has one (Django 6.1's
    `{% csp_nonce_attr %}`, which Django 6.0 lacks)."""
    from django.utils import csp

    if hasattr(csp, "nonce_attr"):
        return csp.nonce_attr(context, None)
    nonce = context.get("csp_nonce")
    return format_html(' nonce="{}"', nonce) if nonce else ""
