"""Filters of the console templates: `{% load leasing_console %}`."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html

from ..console.durations import humanize_seconds

register = template.Library()


@register.filter
def duration(seconds: Any) -> str:
    """`151` -> `2 min 31 s`; `—` for None or anything that is not a number."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return humanize_seconds(None)
    return humanize_seconds(seconds)


@register.filter
def percent(fraction: Any) -> str:
    """`0.0234` -> `2.3 %`; `—` for None."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        return "—"
    return f"{100 * fraction:.1f} %"


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
