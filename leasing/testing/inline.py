"""The helpers bound to one database: `InlineWorker` (pytest) and `LeasingTestMixin` (TestCase)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..context import WorkContext
from ..handlers import HandlerSpec
from . import assertions, runs
from .overrides import override_handler
from .results import DrainResult, HandlerRun
from .runs import WORKER_ID

if TYPE_CHECKING:
    from ..models import WorkItem


class InlineWorker:
    """Runs work in the test's thread and asserts what was enqueued, on one database.

    What the `leasing_worker` fixture gives a test. Handlers it overrides are
    restored by `close()` (the fixture calls it after the test).
    """

    def __init__(self, *, using: str = "default", worker_id: str = WORKER_ID) -> None:
        self.using = using
        self.worker_id = worker_id
        self._overrides = contextlib.ExitStack()

    def __repr__(self) -> str:
        return f"<InlineWorker using={self.using!r} worker_id={self.worker_id!r}>"

    def run_handler(self, work_type: str, input_data: Any = None, **options: Any) -> HandlerRun:
        """`leasing.testing.run_handler()` on this worker's database."""
        return runs.run_handler(
            work_type, input_data, worker_id=self.worker_id, using=self.using, **options
        )

    def run_item(self, item: WorkItem | str, **options: Any) -> HandlerRun:
        """`leasing.testing.run_item()` on this worker's database."""
        return runs.run_item(item, worker_id=self.worker_id, using=self.using, **options)

    def drain(self, **options: Any) -> DrainResult:
        """`leasing.testing.drain()` on this worker's database."""
        return runs.drain(worker_id=self.worker_id, using=self.using, **options)

    def enqueued(self, work_type: str | None = None, **filters: Any) -> list[WorkItem]:
        return assertions.enqueued(work_type, using=self.using, **filters)

    def assert_enqueued(
        self, work_type: str | None = None, *, count: int | None = None, **filters: Any
    ) -> list[WorkItem]:
        return assertions.assert_enqueued(work_type, count=count, using=self.using, **filters)

    def refute_enqueued(self, work_type: str | None = None, **filters: Any) -> None:
        assertions.refute_enqueued(work_type, using=self.using, **filters)

    def override_handler(
        self, work_type: str, func: Callable[[WorkContext], Any], **options: Any
    ) -> HandlerSpec:
        """Make `func` the handler of `work_type` until `close()`."""
        return self._overrides.enter_context(override_handler(work_type, func, **options))

    def close(self) -> None:
        """Restore the handlers this worker overrode."""
        self._overrides.close()


class LeasingTestMixin:
    """Leasing's test helpers for `django.test.TestCase` (or `TransactionTestCase`).

        class SignupTests(LeasingTestMixin, TestCase):
            def test_welcome_mail(self):
                signup("ada@example.com")
                self.assertEnqueued("send_welcome", input_data={"email": "ada@example.com"})
                self.assertEqual(self.drain().counts["completed"], 1)

    `leasing_database` is the alias the helpers use.
    """

    leasing_database = "default"

    @property
    def leasing_worker(self) -> InlineWorker:
        """This test's `InlineWorker` (its handler overrides end with the test)."""
        worker: InlineWorker | None = self.__dict__.get("_leasing_worker")
        if worker is None:
            worker = InlineWorker(using=self.leasing_database)
            self.__dict__["_leasing_worker"] = worker
            self.addCleanup(self._close_leasing_worker)  # type: ignore[attr-defined]
        return worker

    def _close_leasing_worker(self) -> None:
        self.__dict__.pop("_leasing_worker").close()

    def assertEnqueued(
        self, work_type: str | None = None, *, count: int | None = None, **filters: Any
    ) -> list[WorkItem]:
        return self.leasing_worker.assert_enqueued(work_type, count=count, **filters)

    def assertNotEnqueued(self, work_type: str | None = None, **filters: Any) -> None:
        self.leasing_worker.refute_enqueued(work_type, **filters)

    def enqueued(self, work_type: str | None = None, **filters: Any) -> list[WorkItem]:
        return self.leasing_worker.enqueued(work_type, **filters)

    def run_handler(self, work_type: str, input_data: Any = None, **options: Any) -> HandlerRun:
        return self.leasing_worker.run_handler(work_type, input_data, **options)

    def run_item(self, item: WorkItem | str, **options: Any) -> HandlerRun:
        return self.leasing_worker.run_item(item, **options)

    def drain(self, **options: Any) -> DrainResult:
        return self.leasing_worker.drain(**options)

    def override_handler(
        self, work_type: str, func: Callable[[WorkContext], Any], **options: Any
    ) -> HandlerSpec:
        """Make `func` the handler of `work_type` until the test ends."""
        return self.leasing_worker.override_handler(work_type, func, **options)
