"""The leasing admin changes nothing on the admin site it is installed in.

The link to the dashboard on the admin index is opt-in: a site uses the
app's `admin/leasing/site_index.html` as its index template, or includes
`admin/leasing/includes/dashboard_link.html` in its own `admin/index.html`,
as the demo site does from the project's top-level `templates/` directory.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.test import Client

from tests.support.admin import VIEW_ALL, make_user
from tests.support.helpers import ROOT

pytestmark = pytest.mark.django_db


def test_importing_the_admin_leaves_the_index_template_alone(subprocess_env):
    script = (
        "import django; django.setup()\n"
        "from django.contrib import admin\n"
        "import leasing.admin\n"
        "assert leasing.admin.WorkItemAdmin in {type(a) for a in admin.site._registry.values()}\n"
        "print(repr(admin.site.index_template), repr(admin.site.app_index_template))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None None"


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(make_user("viewer", *VIEW_ALL))
    return client
