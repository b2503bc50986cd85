"""The app without its extras: psycopg, django-q2, prometheus-client and
dj-database-url are optional, so nothing may import them when the app loads."""

from __future__ import annotations

import sys

import pytest
from django.test import Client

from tests.support.admin import VIEW_ALL, make_user


@pytest.mark.django_db
def test_metrics_answer_503_naming_the_extra_when_prometheus_client_is_missing(monkeypatch):
    staff = Client()
    staff.force_login(make_user("ops", *VIEW_ALL))
    assert staff.get("/metrics").status_code == 200
    # A None entry makes `import prometheus_client...` raise ImportError.
    for name in ("prometheus_client", "prometheus_client.core"):
        monkeypatch.setitem(sys.modules, name, None)
    response = staff.get("/metrics")
    assert response.status_code == 503
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert b"pip install 'django-leasing[metrics]'" in response.content
    # Access is still checked first: an anonymous caller learns nothing.
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 302
