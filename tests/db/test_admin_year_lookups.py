"""A date lookup value no date can have (`?run_after__year=0`) on any leasing list is
answered as Django answers an invalid lookup: a redirect to the list with `?e=1`,
never a 500.

Django checks such a value only when it compiles the list's query (there is no
year 0), after the filters were applied: the date hierarchy's column was
hardened, every other date column of every list answered a 500. Runs on SQLite
and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.db import models
from django.test import Client

from leasing.models import Checkpoint, IdempotencyKey, Schedule, Worker, WorkItem
from tests.support.admin import make_user

pytestmark = pytest.mark.django_db

LISTS = (WorkItem, Checkpoint, IdempotencyKey, Worker, Schedule)
DATE_FIELDS = [
    pytest.param(model, field.name, id=f"{model._meta.model_name}-{field.name}")
    for model in LISTS
    for field in model._meta.concrete_fields
    if isinstance(field, models.DateField)  # DateTimeField included
]
NO_SUCH_YEAR = ["0", "-1", "99999999999"]


@pytest.fixture
def root() -> Client:
    client = Client()
    client.force_login(make_user("root", superuser=True))
    return client


def _list_url(model: Any) -> str:
    return f"/admin/leasing/{model._meta.model_name}/"


def test_every_leasing_list_is_covered():
    """A new leasing list must be added to LISTS (and be hardened like the others)."""
    registered = {m for m in admin.site._registry if m._meta.app_label == "leasing"}
    assert registered == set(LISTS)


@pytest.mark.parametrize("year", NO_SUCH_YEAR)
@pytest.mark.parametrize(("model", "field"), DATE_FIELDS)
def test_a_year_no_date_has_is_an_invalid_lookup_not_a_500(root, model, field, year):
    url = _list_url(model)
    response = root.get(url, {f"{field}__year": year})
    assert response.status_code == 302, response.status_code
    assert response["Location"] == f"{url}?e=1"
    shown = root.get(response["Location"])
    assert shown.status_code == 200
    assert "admin/change_list.html" in [t.name for t in shown.templates]


@pytest.mark.parametrize(("model", "field"), DATE_FIELDS)
def test_a_real_year_still_filters_the_list(root, model, field):
    response = root.get(_list_url(model), {f"{field}__year": "2026"})
    assert response.status_code == 200
    assert "admin/change_list.html" in [t.name for t in response.templates]
