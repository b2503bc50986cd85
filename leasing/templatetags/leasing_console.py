"""Filters of the console templates: `{% load leasing_console %}`."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.dateformat import format as format_date
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import localtime

from ..admin.display import badge
from ..console.durations import humanize_seconds
from ..console.processes import SweepHealth

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


# The dashboard's process tables render these cells and rows in Python: with many workers
# and lease links, an `{% include %}` per row and a loop per link were a large
# share of the page's time.


@register.simple_tag
def leasing_liveness(process: Any, compact: bool = False) -> SafeString:
    """Status and liveness of one process (a console ProcessInfo): red "silent …"
    when a running process was not seen for three of its own intervals.

    `compact` (a healthy row of a long list): its intervals go in a tooltip."""
    alive = process.liveness
    seen = format_date(localtime(process.last_seen_at), "Y-m-d H:i:s")
    if getattr(process, "leases_at_risk", False) and not alive.silent:
        # Lost or stopped, yet still named as the holder of leases.
        return format_html(
            '{} <strong class="leasing-bad-text leasing-nowrap" title="last seen {}">{}</strong>'
            '<span class="leasing-sub">leases at risk until recovered</span>',
            badge("worker", "lost", process.status),
            seen,
            alive.text,
        )
    intervals = (
        f"beats every {humanize_seconds(alive.interval_seconds)}; "
        f"silent after {humanize_seconds(alive.limit_seconds)}"
    )
    beats = format_html('<span class="leasing-sub">{}</span>', intervals)
    if compact and not alive.silent:
        return format_html(
            '{} <span class="leasing-nowrap" title="last seen {}; {}">{}</span>',
            badge("worker", process.status, process.status),
            seen,
            intervals,
            alive.text,
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


def lease_fate(expires_in: float, sweep: SweepHealth) -> str:
    """What happens to a lease nothing renews any more, as the sweep's health says."""
    if expires_in < 0:
        left = f"expired {humanize_seconds(-expires_in)} ago"
    else:
        left = f"expires in {humanize_seconds(expires_in)}"
    return f"{left}, {sweep.lease_fate}" if sweep.ok else f"{left}; {sweep.lease_fate}"


@register.simple_tag
def leasing_lease_links(row: dict[str, Any], sweep: SweepHealth) -> SafeString:
    """A row's lease links, then "all N…" when the row shows only some.

    A row at risk (its holder silent, lost or gone) says of each lease when it
    expires and what follows, as `sweep` (the page's sweep health) says."""
    if row.get("at_risk"):
        links = format_html_join(
            "",
            '<span class="leasing-at-risk-lease" data-lease="{}"><a href="{}">{}</a>'
            '<span class="leasing-sub leasing-bad-text">{}</span></span>',
            ((pk, url, pk, lease_fate(expires_in, sweep)) for pk, url, expires_in in row["leases"]),
        )
    else:
        links = format_html_join(
            "", '<a href="{}">{}</a>', ((url, pk) for pk, url, _ in row["leases"])
        )
    if row["more_url"] is None:
        return links
    return format_html('{}<a href="{}">all {}…</a>', links, row["more_url"], row["lease_count"])


@register.simple_tag
def leasing_worker_row(row: dict[str, Any], sweep: SweepHealth) -> SafeString:
    """One row of the dashboard's workers table (`admin/leasing/dashboard/workers.html`):
    the worker, its status and liveness, leases, runs, counters and lease links."""
    w = row["process"]
    if w.problem:
        name = format_html(
            '<a class="leasing-nowrap" href="{}">{}</a>'
            '<span class="leasing-sub" title="concurrency {}">{}, pid {}</span>',
            row["url"],
            w.worker_id,
            w.concurrency,
            w.hostname,
            w.pid,
        )
    else:
        name = format_html(
            '<a class="leasing-nowrap" href="{}" title="{}, pid {}, concurrency {}">{}</a>',
            row["url"],
            w.hostname,
            w.pid,
            w.concurrency,
            w.worker_id,
        )
    expired = (
        format_html(
            ' <span class="leasing-expired leasing-sub">{} expired</span>', w.expired_lease_count
        )
        if w.expired_lease_count
        else ""
    )
    runs = format_html(
        '<span class="leasing-nowrap">{} busy, {} idle</span>', w.runs_busy, w.runs_idle
    )
    if w.runs_abandoned:
        runs += format_html(
            ' <span class="leasing-bad-text leasing-nowrap" title="fenced out (timed out, lease'
            ' lost); the handler thread still runs">{} abandoned</span>',
            w.runs_abandoned,
        )
    if w.requested_action:
        runs += format_html(
            ' <span class="leasing-badge leasing-worker-stopping" title="asked by {}: {}">'
            "{} requested</span>",
            w.requested_by,
            w.request_reason,
            w.requested_action,
        )
    elif w.quiet_since:
        runs += mark_safe(' <span class="leasing-badge leasing-worker-stopping">quiet</span>')
    return format_html(
        '<tr class="{}" data-worker="{}" data-at-risk="{}">\n'
        "        <td>{}</td>\n"
        "        <td>{}</td>\n"
        '        <td class="num">{}{}</td>\n'
        '        <td class="leasing-worker-runs">{}</td>\n'
        '        <td class="num leasing-nowrap">{} / {}</td>\n'
        '        <td class="leasing-lease-ids">{}</td>\n'
        "      </tr>\n",
        "leasing-row-bad" if w.liveness.silent or w.leases_at_risk else "",
        w.worker_id,
        "yes" if w.leases_at_risk else "no",
        name,
        leasing_liveness(w, compact=True),
        w.lease_count,
        expired,
        runs,
        w.items_completed,
        w.items_failed,
        leasing_lease_links(row, sweep),
    )


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
