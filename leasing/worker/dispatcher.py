"""The dispatcher's round trip: complete what finished, claim what fits, hand it to executors.

On PostgreSQL one statement does both halves; finished items wait a moment
for company, so one round trip completes and claims many at once. Handlers
faster than `FAST_HANDLER_SECONDS` on average let the dispatcher claim a
little ahead (prefetch), so executors never wait for the round trip; slow
work is never hoarded, and is claimed at most `CLAIM_CHUNK` items a round trip:
the first handlers start while the rest are claimed. An item of a type with a
`timeout` claimed ahead of a free executor is marked so (`Slot.ahead`): its
timeout counts from its start, not its claim.

While work is scarce (the last claim got less than it asked for), a worker
woken by NOTIFY that is not draining (`--burst`) spends as few round trips as
it can. The one that answers wakes (`leads`, see `leasing.worker.leadership`),
and any other whose last claim still got `ENGAGED_ITEMS` or more (more arrives
than the leader takes): finished items wait up to `LINGER_SECONDS` for the next
claim to ride along with, and a claim follows the one before by at least
`CLAIM_COOLDOWN_SECONDS`, so the wakes of several small enqueues share one
round trip. The others hear of new work only by polling: they complete what
finished without claiming, and claim at the next poll. None claims again at
once after a short claim. Without these, a trickle of enqueues cost each
worker a claim, an empty claim and a completion for every few items.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError

from ..exceptions import DatabaseUnavailable
from ..services.completion import Completion, complete, complete_and_claim
from ..services.held import Lease
from ..services.leases import LeaseManager
from ..sql.runner import close_connection, is_infrastructure_error
from .executors import ExecutorPool
from .options import WorkerConfig
from .outcomes import Counters, one_line
from .slots import Slot, SlotTable

logger = logging.getLogger("leasing.worker")

# Handlers faster than this on average let the dispatcher claim ahead.
FAST_HANDLER_SECONDS = 0.05
PREFETCH_AHEAD_SECONDS = 0.1
# Only the quickest handlers reach it: each round trip costs planning and a
# commit whatever its size, so the more rows it carries the less a job pays.
MAX_PREFETCH = 1000

# Slow work (no prefetch) is claimed at most this many items a round trip, the
# next round trip following at once. One claim of all of them kept every idle
# executor waiting for the whole claim, and several such claims at once
# (workers started together) each stepped past the rows the others had locked.
CLAIM_CHUNK = 100

# While work is scarce: how long finished items wait for a claim to share a
# round trip with, and the least time between two claims (oban-py's producer
# debounces its fetches for the same reason).
LINGER_SECONDS = 0.05
CLAIM_COOLDOWN_SECONDS = 0.025
# A worker that does not lead keeps claiming while its claims get this many items.
ENGAGED_ITEMS = 32
# Its polls meanwhile take only items available for this long: the leader claims
# each wake's items at once, or every `TRICKLE_POLL_S` while it trickles, so
# fresher ones are its own, and a poll that took them cost two round trips
# (the claim, and a completion of its own) for what the leader's next claim
# would have carried. An item the leader does not take (it stepped down, or its
# dispatcher is stuck) still waits at most a poll, plus this.
POLL_SETTLED_S = 0.25

Finished = tuple[Slot, str | None]  # a slot and its handler's output, encoded as JSON


class Dispatcher:
    """Owns the finished results waiting to be written and the claims in flight."""

    def __init__(
        self,
        config: WorkerConfig,
        manager: LeaseManager,
        slots: SlotTable,
        pool: ExecutorPool,
        counters: Counters,
        *,
        on_done: Callable[[list[Slot]], None],
        wake: Callable[[], None],
        excluded: Callable[[], tuple[str, ...]] = lambda: (),
        screen: Callable[[list[Slot]], list[Slot]] = lambda slots: slots,
    ) -> None:
        # Drops claimed slots that must not run (their item's old run still runs here).
        self.screen = screen
        self.config = config
        # Items not to claim now (those whose abandoned run still runs here).
        self.excluded = excluded
        self.manager = manager
        self.slots = slots
        self.pool = pool
        self.counters = counters
        self.on_done = on_done
        self.wake = wake
        self._finished: list[Finished] = []
        self._first_finished_at = 0.0  # monotonic time the oldest of `_finished` arrived
        self.last_asked = 0  # the number of items the last round trip asked for
        # Monotonic time of the last claim if it got less than it asked for (work is
        # scarce); None after a claim that filled up (more may be waiting).
        self._short_claim_at: float | None = None
        self._last_got = 0  # items the last claim got
        # Whether this worker answers wakes (set by the runtime where a listener runs:
        # it leads); None where no wakes come at all (polling only).
        self.leads: Callable[[], bool] | None = None
        # Whether it leads a trickle: its claims are timed (`Leadership.trickle_due_in`).
        self.trickling: Callable[[], bool] = lambda: False
        self._lock = threading.Lock()
        self._avg_run_seconds: float | None = None
        # `prefetch()` as of the last round trip: executors read it after every
        # item, so it is worked out once a round trip, not once an item.
        self._prefetch = self.prefetch()

    # --- results from the executors ----------------------------------------------------

    def on_output(self, slot: Slot, output_json: str | None) -> None:
        """An executor's handler returned: queue its result for the next round trip."""
        elapsed = slot.elapsed_ms() / 1000
        average = self._avg_run_seconds
        self._avg_run_seconds = elapsed if average is None else 0.8 * average + 0.2 * elapsed
        with self._lock:
            if not self._finished:
                self._first_finished_at = time.monotonic()
            self._finished.append((slot, output_json))
            finished = len(self._finished)
        # Wake the dispatcher only when a round trip is worth it: waking it for
        # every result costs more than the handler of a quick item. The executor
        # that just finished takes the next queued slot now, so count the queue
        # without it: one queued slot left means the executors are about to run dry.
        # (While finished items linger, the wake-up sets the dispatcher's timer:
        # `worth_a_round_trip` and `due_in` say when to go.)
        # A trickle's timer wakes it for its next claim anyway, which takes these along.
        backlog = self.pool.backlog() - 1
        if finished >= max(1, self._prefetch) or (
            backlog < self.config.concurrency and not (self.trickling() and self._lingering())
        ):
            self.wake()

    def finished_count(self) -> int:
        with self._lock:
            return len(self._finished)

    def worth_a_round_trip(self) -> bool:
        """Finished results wait, and executors are about to run dry or a full batch piled up."""
        return self._worth_it(self.finished_count(), self.pool.backlog())

    def _worth_it(self, finished: int, backlog: int) -> bool:
        if not finished:
            return False
        if finished >= max(1, self._prefetch):
            return True  # a full batch
        if backlog >= self.config.concurrency:
            return False  # the executors are busy
        # They are about to run dry; while work is scarce the finished items wait
        # a little for the next claim (`due_in` says when they stop waiting).
        return not self._lingering() or self._linger_left() <= 0

    @property
    def scarce(self) -> bool:
        """Work is scarce for a worker woken by NOTIFY: the last claim came back short."""
        return self._short_claim_at is not None and self.leads is not None and not self.config.burst

    def _lingering(self) -> bool:
        """Scarce, and this worker claims on: finished items wait for the next claim."""
        return self.scarce and self._engaged()

    def _engaged(self) -> bool:
        """This worker answers wakes, or its claims still get plenty on their own."""
        return self._last_got >= ENGAGED_ITEMS or (self.leads is not None and self.leads())

    def _linger_left(self) -> float:
        with self._lock:
            first = self._first_finished_at if self._finished else None
        return 0.0 if first is None else first + LINGER_SECONDS - time.monotonic()

    def due_in(self) -> float:
        """Seconds until finished items waiting for a claim stop waiting (inf: none wait)."""
        if not self._lingering():
            return float("inf")
        left = self._linger_left()
        return max(left, 0.001) if left > 0 else float("inf")

    # --- the round trip ------------------------------------------------------------------

    def max_items_reached(self) -> bool:
        limit = self.config.max_items
        return limit is not None and self.counters.claimed >= limit

    def prefetch(self) -> int:
        if self.config.prefetch is not None:
            return self.config.prefetch
        average = self._avg_run_seconds
        if average is not None and average < FAST_HANDLER_SECONDS:
            # Claim about PREFETCH_AHEAD_SECONDS of work ahead, so executors stay
            # busy while the dispatcher round-trips and each round trip is a batch.
            ahead = int(PREFETCH_AHEAD_SECONDS / max(average, 1e-4))
            return min(MAX_PREFETCH, max(4 * self.config.concurrency, ahead))
        return 0

    def has_room(self) -> bool:
        """Whether a claim now would ask for at least one item (finished items waiting
        to be written free their slots in the same round trip)."""
        return self._capacity(self.finished_count()) > 0

    def _room(self, finishing: int) -> int:
        """Executors free for a claim now (those of finished items waiting to be written too)."""
        # An executor replacing its child (process execution) takes no run until it is done.
        return self.config.concurrency - self.pool.restarting() - (len(self.slots) - finishing)

    def _capacity(self, finishing: int) -> int:
        c = self.config
        capacity = self._room(finishing) + self._prefetch
        if not self._prefetch:
            capacity = min(capacity, CLAIM_CHUNK)
        if c.max_items is not None:
            capacity = min(capacity, c.max_items - self.counters.claimed)
        return capacity

    def _take(self) -> list[Finished]:
        with self._lock:
            batch, self._finished = self._finished, []
        return batch

    def _put_back(self, batch: list[Finished]) -> None:
        with self._lock:
            self._finished[:0] = batch

    def cycle(self, *, claiming: bool, polled: bool = False) -> int:
        """Complete what finished and (when `claiming`) claim what fits; returns the claims.

        `polled`: nothing woke this worker, its poll interval ran out. One that
        does not answer wakes then leaves items fresher than `POLL_SETTLED_S` to
        the one that does (see `leasing.worker.leadership`).
        """
        self._prefetch = self.prefetch()
        settled_s = 0.0
        if polled and self.scarce and not self._engaged():
            settled_s = POLL_SETTLED_S
        if claiming and self.scarce:
            if self._lingering():
                self._cool_down()
            elif self.finished_count():
                claiming = False  # not woken for new work: this is only a completion
        batch = self._take()
        done = [(slot.lease, output) for slot, output in batch]
        capacity = self._capacity(len(batch)) if claiming else 0
        room = self._room(len(batch))
        self.last_asked = capacity
        c = self.config
        try:
            if capacity > 0:
                filters = c.filters
                if excluded := self.excluded():
                    filters = dataclasses.replace(filters, exclude_ids=excluded)
                if settled_s > 0:
                    filters = dataclasses.replace(filters, settled_s=settled_s)
                completion, leases = complete_and_claim(
                    self.manager, done, capacity, c.terms, filters
                )
            else:
                completion, leases = complete(self.manager, done), []
        except BaseException:
            self._put_back(batch)  # written after reconnecting
            raise
        self._finish(batch, completion)
        if capacity > 0:
            self._short_claim_at = time.monotonic() if len(leases) < capacity else None
            self._last_got = len(leases)
        return self._start(leases, room)

    def _cool_down(self) -> None:
        """Let `CLAIM_COOLDOWN_SECONDS` pass since the last (short) claim."""
        short_at = self._short_claim_at
        rest = 0.0 if short_at is None else short_at + CLAIM_COOLDOWN_SECONDS - time.monotonic()
        if rest > 0:
            time.sleep(rest)

    def _finish(self, batch: list[Finished], completion: Completion) -> None:
        slot_of = {slot.key: slot for slot, _ in batch}
        ended = [slot_of[lease.key] for lease in completion.completed]
        if logger.isEnabledFor(logging.DEBUG):  # once a batch, not once an item
            for slot in ended:
                lease = slot.lease
                logger.debug(
                    "done %s (%s) in %d ms", lease.work_item_id, lease.work_type, slot.elapsed_ms()
                )
        for lease in completion.lost:
            logger.warning(
                "lease on %s (%s, token %d) was lost before completion; result discarded "
                "(another run or the sweep owns it now, or an operator deleted it)",
                lease.work_item_id,
                lease.work_type,
                lease.token,
            )
            ended.append(slot_of[lease.key])
        for lease, reason in completion.unstorable:
            logger.error("failed %s (%s): %s", lease.work_item_id, lease.work_type, reason)
            ended.append(slot_of[lease.key])
        self.on_done(ended)
        unwritten = {lease.key for lease, _ in completion.unwritten}
        if unwritten:
            self._put_back([entry for entry in batch if entry[0].key in unwritten])
        self.counters.add(
            completed=len(completion.completed),
            lost=len(completion.lost),
            failed=len(completion.unstorable),
        )

    def _start(self, leases: list[Lease], room: int) -> int:
        """Hand claimed leases to the executors; the first `room` start at once."""
        if not leases:
            return 0
        specs, terms = self.config.specs, self.config.terms
        claimed_at = time.monotonic()
        slots = [
            Slot(
                lease,
                specs[lease.work_type],
                terms.duration_for(lease.work_type),
                claimed_at=claimed_at,
            )
            for lease in leases
        ]
        self.counters.add(claimed=len(leases))
        slots = self.screen(slots)
        # Those past the free executors wait behind other runs: a timed one has its
        # timeout count from its start, so the wait never times it out.
        for slot in slots[max(room, 0) :]:
            slot.ahead = slot.spec.timeout is not None
        self.slots.add_all(slots)
        if logger.isEnabledFor(logging.DEBUG):
            for lease in leases:
                logger.debug(
                    "claimed %s (%s, token %d, attempt %d/%d)",
                    lease.work_item_id,
                    lease.work_type,
                    lease.token,
                    lease.retry_count + 1,
                    lease.max_retries + 1,
                )
        self.pool.submit(slots)
        return len(leases)

    # --- shutting down --------------------------------------------------------------------

    def flush(self) -> None:
        """Complete finished items (no claims); database trouble is retried later."""
        try:
            self.cycle(claiming=False)
        except (DatabaseUnavailable, DatabaseError) as exc:
            if not is_infrastructure_error(exc):  # an outage or a lock conflict
                raise
            logger.warning("completing finished items failed: %s", one_line(exc))
            close_connection(self.config.using)

    def flush_until_written(self) -> None:
        """Do not exit holding results the database has not taken yet.

        Tries until they are written, or their leases surely ran out (the
        sweep owns those items then).
        """
        while True:
            with self._lock:
                self._finished = [e for e in self._finished if not e[0].lease_surely_expired()]
                if not self._finished:
                    return
            self.flush()
            if self.finished_count():
                time.sleep(0.2)
