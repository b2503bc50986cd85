"""The Prometheus endpoint of the leasing app (`/metrics` through `leasing.urls`).

The dashboard and the checkpoint timeline are admin views: see
`leasing.admin.views`.
"""

from __future__ import annotations

import contextlib
import hmac

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from .conf import get_settings, read_alias
from .console.unreachable import unreachable
from .exceptions import DatabaseUnavailable
from .metrics import render_latest


def _bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    # WSGI hands headers over as ISO-8859-1 text: a UTF-8 token (non-ASCII) arrives as
    # its bytes read one by one, and is read back as the client sent it. Not UTF-8
    # bytes (or not from WSGI): compared as it came.
    with contextlib.suppress(UnicodeError):
        token = token.encode("latin-1").decode("utf-8")
    return token.strip()


def _same_token(given: str, expected: str) -> bool:
    """Constant-time comparison of any two strings.

    `hmac.compare_digest` refuses str with non-ASCII characters (a TypeError,
    i.e. a 500 for `Authorization: Bearer é`), so both are compared as bytes;
    `surrogatepass` keeps a lone surrogate from raising too.
    """
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def _unauthorized() -> HttpResponse:
    response = HttpResponse(
        "Invalid metrics token.\n", status=401, content_type="text/plain; charset=utf-8"
    )
    response["WWW-Authenticate"] = 'Bearer realm="leasing-metrics"'
    return response


# Exempt so that another method meets require_safe's 405, not the CSRF middleware's 403
# (which runs first); the view only reads, so there is nothing to forge.
@csrf_exempt
@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition of the leasing tables, computed at scrape time.

    Access: `Authorization: Bearer <LEASING["METRICS_TOKEN"]>`, or a logged-in
    staff session. A wrong, malformed or unexpected token gets 401, a
    logged-in non-staff user 403, and an anonymous browser is sent to the
    admin login. The query string is ignored. GET and HEAD only: any other
    method gets 405. A database that does not answer (the read database, or
    the primary), or one that cancels the scrape's query (`statement_timeout`,
    `lock_timeout`, a conflict with recovery on a replica), gets 503 and one
    line saying which and why: the scrape fails rather than report figures from
    elsewhere.
    """
    token = _bearer_token(request)
    if token is not None or "Authorization" in request.headers:
        expected = get_settings().metrics_token
        if not expected or not token or not _same_token(token, expected):
            return _unauthorized()
    elif not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), reverse("admin:login"))
    elif not (request.user.is_active and request.user.is_staff):
        raise PermissionDenied
    try:
        body, content_type = render_latest(read_alias())
    except (DatabaseUnavailable, DatabaseError) as exc:
        outage = unreachable(exc, read_only=True)  # require_safe: a scrape writes nothing
        if outage is None:
            raise
        return HttpResponse(
            f"{outage.text}\n", status=503, content_type="text/plain; charset=utf-8"
        )
    return HttpResponse(body, content_type=content_type)
