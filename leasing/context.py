"""What a handler gets: its lease, its input and fenced ways to record progress.

    @handler("import_pages")
    def import_pages(ctx: WorkContext):
        state = ctx.resume_state() or {"page": 0}
        ...
        ctx.checkpoint("iteration_end", state)
        ctx.beat()

Every write through the context is fenced by the lease (holder and token):
a run whose lease moved on (recovered by the sweep, force-released by an
operator, re-claimed even by the same process) writes nothing. Once the
worker learns the lease is lost (`lease_lost`), writes are refused without
touching the database.

A run asked to stop (`leasing.cancel()`) learns it within one heartbeat
interval: `ctx.cancelled` turns True, and `checkpoint()` and `run_once()`
raise `Cancelled` instead of writing; the run then ends `cancelled`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import signals
from .exceptions import Cancelled, LeaseLostError
from .heartbeat import Heartbeat
from .services.checkpoints import create_checkpoint, resume_state
from .services.held import Lease
from .services.idempotency import run_once

if TYPE_CHECKING:
    from .models import Checkpoint

# Guards every context's loss flag against its lazily made Event (rarely taken:
# only when a loss is marked or waited on).
_LOST_LOCK = threading.Lock()


class WorkContext:
    """The context one run of a handler gets (one lease, one heartbeat)."""

    def __init__(self, lease: Lease, heartbeat: Heartbeat, *, using: str = "default") -> None:
        self.lease = lease
        self.heartbeat = heartbeat
        self.using = using
        self._lost = False
        self._lost_reason = ""
        self._cancelled = False
        # Made on the first wait only: a worker builds a context per item, and
        # an Event (a Condition and two locks) cost more than a no-op handler.
        self._lost_event: threading.Event | None = None

    def __repr__(self) -> str:
        return f"<WorkContext {self.lease.work_item_id} token={self.lease.token}>"

    @property
    def input(self) -> Any:
        return self.lease.input_data

    @property
    def worker_id(self) -> str:
        return self.lease.worker_id

    @property
    def attempt(self) -> int:
        """1 for the first run, 2 for the first retry, ..."""
        return self.lease.retry_count + 1

    @property
    def lease_lost(self) -> bool:
        return self._lost

    @property
    def lease_lost_reason(self) -> str:
        return self._lost_reason

    def mark_lease_lost(self, reason: str) -> None:
        with _LOST_LOCK:
            if self._lost:
                return
            self._lost_reason = reason
            self._lost = True
            event = self._lost_event
        if event is not None:
            event.set()

    @property
    def cancelled(self) -> bool:
        """The item was asked to stop: finish up and return, or raise `Cancelled`."""
        return self._cancelled

    def request_cancel(self) -> None:
        """The worker saw a request to stop this item (`leasing.cancel()`)."""
        self._cancelled = True

    def wait_lease_lost(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost or `timeout` passes; True if lost."""
        with _LOST_LOCK:
            if self._lost_event is None:
                self._lost_event = threading.Event()
                if self._lost:
                    self._lost_event.set()
            event = self._lost_event
        return event.wait(timeout)

    def _ensure_held(self) -> None:
        if self._cancelled:
            raise Cancelled(
                f"Work item {self.lease.work_item_id!r} was asked to stop; this write was "
                "refused and the run ends cancelled."
            )
        if self._lost:
            raise LeaseLostError(
                f"The lease on work item {self.lease.work_item_id!r} (token {self.lease.token}) "
                f"was lost ({self._lost_reason}); this write was refused."
            )

    def beat(self) -> None:
        """Record proof of progress (and, in `beat` mode, keep the lease alive)."""
        self.heartbeat.beat()
        if signals.listened(signals.heartbeat):
            signals.send_now(signals.heartbeat, WorkContext, signals.lease_event(self.lease))

    def checkpoint(
        self, checkpoint_type: str, snapshot: Any, metadata: dict[str, Any] | None = None
    ) -> Checkpoint:
        """Append a checkpoint for this task, fenced by the lease."""
        self._ensure_held()
        try:
            return create_checkpoint(
                self.lease.task_id,
                checkpoint_type,
                snapshot,
                metadata=metadata,
                lease=self.lease,
                using=self.using,
            )
        except LeaseLostError as exc:
            self.mark_lease_lost(str(exc))
            raise

    def resume_state(self) -> Any:
        """The last `iteration_end` snapshot of this task, or None."""
        return resume_state(self.lease.task_id, using=self.using)

    def run_once(
        self,
        key: str,
        request: Any,
        fn: Callable[[], Any],
        *,
        ttl: timedelta | None = None,
        atomic: bool = False,
    ) -> Any:
        """Run `fn()` at least once per `key` and never again once its response is recorded:
        an effect that happened just before a crash (or a lost lease) runs
        again, except `fn`'s writes to this database with `atomic=True`, which
        commit in the record's own transaction and so happen at most once.

        Claiming the key and recording its response are fenced by this lease:
        a run whose lease moved on never starts `fn`, and one that lost it
        while `fn` ran records nothing (`LeaseLostError`; with `atomic=True`
        `fn`'s writes are rolled back). See `leasing.run_once`.
        """
        self._ensure_held()
        try:
            return run_once(
                key,
                request,
                fn,
                task_id=self.lease.task_id,
                work_item=self.lease.work_item_id,
                ttl=ttl,
                lease=self.lease,
                atomic=atomic,
                using=self.using,
            )
        except LeaseLostError as exc:
            self.mark_lease_lost(str(exc))
            raise
