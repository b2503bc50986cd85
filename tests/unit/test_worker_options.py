"""What a worker embedded from Python (`WorkerOptions`) is checked for before it runs."""

from __future__ import annotations

import pytest
from django.db import connections

from leasing.exceptions import InvalidInput
from leasing.worker.options import WorkerOptions, resolve

OPTIONS = {"work_types": ("test.noop",)}


@pytest.mark.parametrize("using", ["nope", "", None, 3])
def test_an_unknown_database_alias_is_refused_naming_the_aliases(using):
    with pytest.raises(InvalidInput, match=r"must name a database alias of settings\.DATABASES"):
        resolve(WorkerOptions(using=using, **OPTIONS))


@pytest.fixture
def aliases():
    """ "direct" (LISTEN_DATABASE: the default database without its pooler) and "other" (a
    Tasks backend's OPTIONS['DATABASE'])."""
    for alias in ("direct", "other"):
        connections.settings[alias] = dict(connections.settings["default"])
    try:
        yield
    finally:
        for alias in ("direct", "other"):
            del connections.settings[alias]


def test_listen_database_serves_the_default_alias_only(settings, aliases):
    """LISTEN_DATABASE is a direct connection to the default database: a worker of another
    alias listening there would never hear its own wakes."""
    settings.LEASING = {**settings.LEASING, "LISTEN_DATABASE": "direct"}
    assert resolve(WorkerOptions(**OPTIONS)).listen_database == "direct"
    assert resolve(WorkerOptions(using="other", **OPTIONS)).listen_database == "other"
