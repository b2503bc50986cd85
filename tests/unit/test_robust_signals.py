"""What a receiver or a background round raises stays where it was raised.

A lease signal's receiver raising anything, a BaseException too, is logged and
the receivers after it still run, with Django's choice of receivers (a sender
filter, a weak reference that died). An `IntervalThread` whose round raises
anything logs it and goes on ticking.
"""

from __future__ import annotations

import gc
import logging
import threading

import pytest
from django.dispatch import Signal

from leasing.signals import send_now
from leasing.threads import IntervalThread


class Raised(BaseException):
    pass


RAISED = [KeyboardInterrupt, SystemExit, GeneratorExit, Raised, ValueError]


class Sender:
    pass


class OtherSender:
    pass


@pytest.mark.parametrize("raised", RAISED)
def test_a_receiver_raising_anything_is_logged_and_the_next_one_still_runs(raised, caplog):
    signal = Signal()
    calls = []

    def raising(sender, **kwargs):
        calls.append("raising")
        raise raised("from a receiver")

    def after(sender, work_item_id, **kwargs):
        calls.append(("after", sender, work_item_id, kwargs["signal"] is signal))

    signal.connect(raising, weak=False)
    signal.connect(after, weak=False)
    with caplog.at_level(logging.ERROR, logger="leasing.signals"):
        try:
            send_now(signal, Sender, {"work_item_id": "a"})
        except BaseException as exc:  # a KeyboardInterrupt would end the test run
            pytest.fail(f"the receiver's {exc!r} reached the sender")
    assert calls == ["raising", ("after", Sender, "a", True)]
    [failure] = caplog.records
    assert failure.getMessage().startswith("a receiver of a lease signal failed")
    assert isinstance(failure.exc_info[1], raised)


def test_receivers_are_chosen_as_django_chooses_them():
    signal = Signal()
    calls = []

    def for_sender(sender, **kwargs):
        calls.append("for_sender")

    def for_other(sender, **kwargs):
        calls.append("for_other")

    def weak(sender, **kwargs):
        calls.append("weak")

    signal.connect(for_sender, sender=Sender, weak=False)
    signal.connect(for_other, sender=OtherSender, weak=False)
    signal.connect(weak)  # a weak reference, as `@receiver` keeps by default
    send_now(signal, Sender, {})
    assert calls == ["for_sender", "weak"]
    del weak
    gc.collect()
    calls.clear()
    send_now(signal, Sender, {})
    assert calls == ["for_sender"]  # the dead weak reference is skipped


def test_an_async_receiver_raising_a_base_exception_is_logged_and_the_others_still_run(caplog):
    signal = Signal()
    calls = []

    async def raising(sender, **kwargs):
        calls.append("async raising")
        raise SystemExit("from an async receiver")

    async def after(sender, **kwargs):
        calls.append("async after")

    def sync(sender, **kwargs):
        calls.append("sync")

    for receiver in (raising, after, sync):
        signal.connect(receiver, weak=False)
    with caplog.at_level(logging.ERROR, logger="leasing.signals"):
        send_now(signal, Sender, {})
    assert calls == ["sync", "async raising", "async after"]  # Django's order
    [failure] = caplog.records
    assert isinstance(failure.exc_info[1], SystemExit)


class Ticking(IntervalThread):
    def __init__(self, raised: list[type[BaseException]]) -> None:
        super().__init__(name="ticking", interval=0.001, using="default")
        self.raised = list(raised)
        self.ticks = 0
        self.went_on = threading.Event()

    def tick(self) -> bool:
        self.ticks += 1
        if self.raised:
            raise self.raised.pop(0)("from a round")
        self.went_on.set()
        return True  # done: the thread ends


def test_an_interval_thread_goes_on_after_a_round_raises_anything(caplog):
    thread = Ticking([KeyboardInterrupt, SystemExit, GeneratorExit, Raised, RuntimeError])
    with caplog.at_level(logging.ERROR, logger="leasing"):
        thread.start()
        assert thread.went_on.wait(20), "the thread stopped ticking after a round raised"
        thread.stop()
    assert thread.ticks == 6
    assert not thread.is_running()
    failures = [r for r in caplog.records if "a round failed" in r.getMessage()]
    assert [type(r.exc_info[1]) for r in failures] == [
        KeyboardInterrupt,
        SystemExit,
        GeneratorExit,
        Raised,
        RuntimeError,
    ]
