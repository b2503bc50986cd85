"""`end_left_transactions()`: what a handler left open on its thread's connections is
rolled back, and the connection is as Django leaves it after a request.

Django resets a wrapper's atomic state only when it opens a new connection, and
refuses `rollback()`, `set_autocommit()` and `close()` inside an atomic block: a
block nobody exits kept the executor's connection in its transaction for good.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from leasing import enqueue
from leasing.models import WorkItem
from leasing.sql.runner import HangUpWatch, end_left_transactions, refresh_connection

pytestmark = pytest.mark.django_db(transaction=True)


def assert_clean() -> None:
    assert not connection.in_atomic_block
    assert connection.atomic_blocks == [] and connection.savepoint_ids == []
    assert not connection.needs_rollback and not connection.closed_in_transaction
    assert connection.get_autocommit()
    # Usable, and its writes commit by themselves again.
    item = enqueue("after", "test.noop")
    with transaction.atomic():  # Django accepts a block again
        assert WorkItem.objects.filter(pk=item.pk).exists()


def test_nothing_open_is_nothing_to_do():
    WorkItem.objects.exists()
    assert end_left_transactions() == []
    assert_clean()


def test_nested_atomic_blocks_never_exited_are_rolled_back():
    transaction.atomic().__enter__()
    item = enqueue("inside", "test.noop")
    transaction.atomic().__enter__()  # a savepoint too
    called = []
    transaction.on_commit(lambda: called.append(1))
    assert end_left_transactions() == ["default"]
    assert not WorkItem.objects.filter(pk=item.pk).exists()
    assert called == []  # its transaction never committed
    assert_clean()


def test_a_block_that_broke_its_transaction_is_rolled_back():
    transaction.atomic().__enter__()
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table_h11")
    connection.needs_rollback = True  # as atomic marks it when an inner block fails
    assert end_left_transactions() == ["default"]
    assert_clean()


def test_autocommit_turned_off_is_restored():
    transaction.set_autocommit(False)
    WorkItem.objects.exists()
    assert end_left_transactions() == ["default"]
    assert_clean()


def test_a_connection_closed_inside_the_block_is_dropped_and_reopens():
    transaction.atomic().__enter__()
    WorkItem.objects.exists()
    connection.close()  # inside atomic: Django keeps the closed driver connection
    assert connection.closed_in_transaction
    assert end_left_transactions() == ["default"]
    assert connection.connection is None
    assert_clean()


def test_refresh_connection_rolls_back_a_transaction_left_open():
    transaction.atomic().__enter__()
    item = enqueue("inside", "test.noop")
    refresh_connection(connection, HangUpWatch(), idle=False)
    assert not WorkItem.objects.filter(pk=item.pk).exists()
    assert_clean()
