"""The leasing admin changes nothing on the admin site it is installed in.

The link to the dashboard on the admin index is opt-in: a site uses the
app's `admin/leasing/site_index.html` as its index template, or includes
`admin/leasing/includes/dashboard_link.html` in its own `admin/index.html`,
as the demo site does from the project's top-level `templates/` directory.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib import admin
from django.test import Client, override_settings

from tests.support.admin import VIEW_ALL, make_user

pytestmark = pytest.mark.django_db

LINK = 'id="leasing-dashboard-link"'


def _without_project_templates() -> list[dict]:
    return [{**engine, "DIRS": []} for engine in settings.TEMPLATES]


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    return client


def test_a_site_without_its_own_index_gets_no_link(viewer):
    with override_settings(TEMPLATES=_without_project_templates()):
        html = viewer.get("/admin/").content.decode()
    assert "Site administration" in html and LINK not in html


def test_a_site_opts_in_with_the_app_index_template(viewer, monkeypatch):
    monkeypatch.setattr(admin.site, "index_template", "admin/leasing/site_index.html")
    with override_settings(TEMPLATES=_without_project_templates()):
        html = viewer.get("/admin/").content.decode()
    assert LINK in html and 'href="/admin/leasing/workitem/dashboard/"' in html


def test_the_demo_site_index_links_the_dashboard_and_carries_its_branding(viewer):
    html = viewer.get("/admin/").content.decode()
    assert LINK in html and 'href="/admin/leasing/workitem/dashboard/"' in html
    assert '<div id="site-name"><a href="/admin/">Leasing demo</a></div>' in html
    assert admin.site.index_template is None
