"""Lease lifecycle signals: other parts of a system can follow every lease.

    from django.dispatch import receiver
    from leasing.signals import lease_released

    @receiver(lease_released)
    def count_outcomes(sender, lease, status, **kwargs):
        metrics.increment(f"leasing.{lease.work_type}.{status}")

Every signal is sent after the change it reports has committed (from the
thread that made it), with `sender` the class that made it and the keyword
arguments `work_item_id`, `token` and `worker_id` (the lease's holder), plus
`lease` (the `Lease`) where the sender has it. Nothing is built or sent when
nobody listens, so an unused signal costs one attribute check. A receiver's
exception is logged and never reaches the worker, whatever it is (also a
`KeyboardInterrupt` or `SystemExit` it raises): the other receivers still run,
and the worker goes on renewing, claiming and completing.

=====================  ==========================================  ======================
signal                 when                                         extra arguments
=====================  ==========================================  ======================
lease_acquired         a worker claimed an item                     -
lease_renewed          a renewal extended (or kept) a lease         expires_at
heartbeat              a handler called `ctx.beat()`                -
lease_released         its holder ended the lease                   status (completed,
                                                                    pending or failed)
lease_expired          the sweep recovered an expired lease         status (pending or
                                                                    failed), timed_out
lease_force_released   an operator force-released it                actor, reason
=====================  ==========================================  ======================
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger("leasing.signals")

lease_acquired = Signal()
lease_renewed = Signal()
heartbeat = Signal()
lease_released = Signal()
lease_expired = Signal()
lease_force_released = Signal()


def send_after_commit(
    signal: Signal,
    sender: type,
    events: Iterable[dict[str, Any]] | Callable[[], Iterable[dict[str, Any]]],
    *,
    using: str,
) -> None:
    """Send `signal` once per event, after the current transaction commits (now if none).

    `events` may be a callable, so that callers build nothing when nobody listens.
    """
    if not signal.receivers or not signal.has_listeners(sender):
        return
    batch = list(events() if callable(events) else events)
    if not batch:
        return

    def send() -> None:
        for event in batch:
            send_robust(signal, sender, event)

    transaction.on_commit(send, using=using)


def send_now(signal: Signal, sender: type, event: dict[str, Any]) -> None:
    """Send one event at once (for what no transaction decides, such as a handler's beat)."""
    if not signal.receivers:
        return
    send_robust(signal, sender, event)


def send_robust(signal: Signal, sender: type, event: dict[str, Any]) -> None:
    """`Signal.send_robust`, but no receiver's exception escapes, not even a BaseException.

    Django's catches `Exception` only: a receiver raising `KeyboardInterrupt` or
    `SystemExit` ended the thread that sent (the lease renewer for good, or the
    worker's main loop with its claimed items left in progress). The receivers
    are Django's live ones (weak references resolved, the sender's filter
    applied), called as `send_robust` calls them: synchronous ones in turn,
    then asynchronous ones together.
    """
    sync_receivers, async_receivers = signal._live_receivers(sender)
    for receiver in sync_receivers:
        try:
            receiver(signal=signal, sender=sender, **event)
        except BaseException as exc:
            _log_failure(receiver, exc)
    if async_receivers:

        async def call(receiver: Callable[..., Any]) -> None:
            try:
                await receiver(signal=signal, sender=sender, **event)
            except BaseException as exc:
                _log_failure(receiver, exc)

        async def call_all() -> None:
            await asyncio.gather(*(call(receiver) for receiver in async_receivers))

        async_to_sync(call_all)()


def _log_failure(receiver: Callable[..., Any], exc: BaseException) -> None:
    logger.error("a receiver of a lease signal failed: %r", receiver, exc_info=exc)


def listened(signal: Signal) -> bool:
    """Whether anyone listens (the cheap check senders make before building events)."""
    return bool(signal.receivers)


def lease_event(lease: Any, **extra: Any) -> dict[str, Any]:
    """The keyword arguments of a signal about `lease`."""
    return {
        "lease": lease,
        "work_item_id": lease.work_item_id,
        "token": lease.token,
        "worker_id": lease.worker_id,
        **extra,
    }
