"""pytest fixtures for testing handlers (needs pytest-django). In a `conftest.py`:

pytest_plugins = ["leasing.testing.pytest"]

def test_welcome_mail(leasing_worker):
    signup("ada@example.com")
    leasing_worker.assert_enqueued("send_welcome", input_data={"email": "ada@example.com"})
    assert leasing_worker.drain().counts["completed"] == 1
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .inline import InlineWorker


@pytest.fixture
def leasing_worker(db: None) -> Iterator[InlineWorker]:
    """An `InlineWorker` on the default database: runs work in the test's thread.

    Uses pytest-django's `db` (the test's transaction, rolled back after it);
    a test that asks for `transactional_db` (or `django_db(transaction=True)`)
    gets that instead. Handlers it overrides are restored after the test.
    """
    worker = InlineWorker()
    yield worker
    worker.close()
