"""Testing your own handlers with leasing.testing: the example of docs/how-to/testing.md.

Written as a project using leasing would write it. The code under test is
`sign_up()` below, which enqueues a welcome mail; the handler is
`example.send_welcome` in tests/testapp/handlers.py (a project's
`myapp/handlers.py`): it mails the address once, however often it runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.db import IntegrityError, transaction
from django.test import TestCase

from leasing import enqueue
from leasing.testing import LeasingTestMixin

# A project puts this line in its conftest.py.
pytest_plugins = ["leasing.testing.pytest"]


def sign_up(email: str) -> User:
    """Create the user and enqueue their welcome mail: both commit, or neither."""
    with transaction.atomic():
        user = User.objects.create(username=email, email=email)
        enqueue(f"user-{user.pk}", "example.send_welcome", {"email": email})
    return user


def test_signing_up_enqueues_a_welcome_mail(leasing_worker: Any) -> None:
    user = sign_up("ada@example.com")

    (item,) = leasing_worker.assert_enqueued(
        "example.send_welcome", input_data={"email": "ada@example.com"}
    )
    assert item.task_id == f"user-{user.pk}"


def test_a_sign_up_that_fails_enqueues_nothing(leasing_worker: Any) -> None:
    sign_up("ada@example.com")
    with pytest.raises(IntegrityError):
        sign_up("ada@example.com")

    leasing_worker.assert_enqueued("example.send_welcome", count=1)


def test_the_welcome_mail_goes_out_once_however_often_it_runs(
    leasing_worker: Any, mailoutbox: list[Any]
) -> None:
    sign_up("ada@example.com")

    result = leasing_worker.drain()

    assert result.counts["completed"] == 1
    assert [message.to for message in mailoutbox] == [["ada@example.com"]]
    # A second run with the same address (a retry after a crash) mails nothing more.
    again = leasing_worker.run_handler("example.send_welcome", {"email": "ada@example.com"})
    assert again.output == {"mailed": "ada@example.com"}
    assert len(mailoutbox) == 1
    assert [c.snapshot_data for c in again.checkpoints] == [{"mailed": "ada@example.com"}]


def test_a_bad_address_fails_at_once_without_retries(leasing_worker: Any) -> None:
    run = leasing_worker.run_handler(
        "example.send_welcome", {"email": "not-an-address"}, raise_errors=False
    )

    assert run.outcome == "failed"
    assert run.item.retry_count == 0
    assert run.item.error_message == "PermanentError: not an address: 'not-an-address'"


def test_a_stub_replaces_the_handler_for_one_test(leasing_worker: Any) -> None:
    sent: list[str] = []
    leasing_worker.override_handler(
        "example.send_welcome", lambda ctx: sent.append(ctx.input["email"])
    )
    sign_up("ada@example.com")

    leasing_worker.drain()

    assert sent == ["ada@example.com"]


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_too(leasing_worker: Any, mailoutbox: list[Any]) -> None:
    sign_up("grace@example.com")

    assert leasing_worker.drain().counts["completed"] == 1
    assert len(mailoutbox) == 1
    leasing_worker.refute_enqueued("example.send_welcome")


class SignUpTests(LeasingTestMixin, TestCase):
    """The same, for a project whose tests are Django `TestCase`s."""

    def test_signing_up_mails_a_welcome_once(self) -> None:
        sign_up("ada@example.com")
        self.assertEnqueued("example.send_welcome", input_data={"email": "ada@example.com"})

        result = self.drain()

        self.assertEqual(result.counts["completed"], 1)
        self.assertEqual(len(mail.outbox), 1)
        self.assertNotEnqueued("example.send_welcome")
