"""A page whose database does not answer, or cancels its query: a 503 saying which and why.

Every URL of the leasing ModelAdmins and console views is wrapped
(`answering_when_unreachable`, from `WorkItemAdmin.get_urls` and its kin). When
the read database (`LEASING["READ_DATABASE"]`) or the primary does not answer,
the page is `admin/leasing/unreachable.html` with status 503: the alias, the
driver's one-line reason and what the operator can do; nothing was written,
and no figure is shown from another database instead. The page's template is
rendered inside the wrapper, so a query a template runs is caught too. The
live refresh (leasing/console.js) takes a 503 as "refresh failed" and keeps
the panels it shows, marked as not refreshed.

A GET or HEAD whose query PostgreSQL cancelled on purpose (`statement_timeout`,
`lock_timeout`, a conflict with recovery on a replica, `pg_cancel_backend`)
gets the same page, worded as a cancellation: try again, or raise the timeout
or narrow the filters. Only those: an operator action (a POST) writes item by
item (`admin.bulk.apply`), so a statement cancelled midway may follow committed
changes, and "nothing was changed" would not hold; it keeps its error.

The wrapper sits outside `AdminSite.admin_view`: a caller the admin does not
let in (or cannot tell, the primary being down or cancelling the session's
read) gets a bare 503 line without the alias or the reason.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib.admin import AdminSite
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.urls import URLPattern
from django.utils.cache import add_never_cache_headers

from ...conf import WRITE_DATABASE
from ...console.unreachable import Unreachable, unreachable
from ...exceptions import DatabaseUnavailable

TEMPLATE = "admin/leasing/unreachable.html"
BARE = "A database the admin reads does not answer; nothing was changed. Try again later.\n"
BARE_CANCELLED = (
    "A database the admin reads cancelled this page's query; nothing was changed. Try again.\n"
)
BARE_UNMIGRATED = (
    "A database the admin reads lacks leasing's tables of this version; nothing was changed.\n"
)
# Methods that change nothing: only these may answer a cancelled query with the 503 page.
READ_ONLY_METHODS = frozenset({"GET", "HEAD"})


def answer_when_unreachable(
    view: Callable[..., HttpResponse], site: AdminSite
) -> Callable[..., HttpResponse]:
    """`view`, answering a database that does not answer (or, for a GET or HEAD,
    cancels the page's query) with the 503 page."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response = view(request, *args, **kwargs)
            if isinstance(response, SimpleTemplateResponse):
                response.render()  # a lazy queryset runs here, inside the try
            return response
        except (DatabaseUnavailable, DatabaseError) as exc:
            outage = unreachable(exc, read_only=request.method in READ_ONLY_METHODS)
            if outage is None:
                raise
        return unreachable_response(request, site, outage)

    return wrapper


def answering_when_unreachable(urls: Iterable[URLPattern], site: AdminSite) -> list[URLPattern]:
    """The URL patterns with each view wrapped by `answer_when_unreachable`."""
    return [
        URLPattern(
            url.pattern, answer_when_unreachable(url.callback, site), url.default_args, url.name
        )
        for url in urls
    ]


def unreachable_response(
    request: HttpRequest, site: AdminSite, outage: Unreachable
) -> HttpResponse:
    """The 503 page for staff; a bare 503 line for anyone else."""
    try:
        response = _page(request, site, outage) if site.has_permission(request) else None
    except (DatabaseUnavailable, DatabaseError):
        response = None  # the primary (sessions, users, permissions) does not answer either
    if response is None:
        bare = (
            BARE_CANCELLED if outage.cancelled else BARE_UNMIGRATED if outage.unmigrated else BARE
        )
        response = HttpResponse(bare, status=503, content_type="text/plain; charset=utf-8")
    add_never_cache_headers(response)
    return response


def _page(request: HttpRequest, site: AdminSite, outage: Unreachable) -> HttpResponse:
    context = {
        **site.each_context(request),
        "title": _title(outage),
        "outage": outage,
        "primary": WRITE_DATABASE,
    }
    return TemplateResponse(request, TEMPLATE, context, status=503).render()


def _title(outage: Unreachable) -> str:
    database = "Read database" if outage.read_database else "Database"
    if outage.cancelled:
        return f"{database} cancelled the query"
    if outage.unmigrated:
        return f"{database} lacks leasing's tables"
    return f"{database} unreachable"
