"""Testing handlers and the code that enqueues work, in the test's own process.

    from leasing.testing import assert_enqueued, drain, run_handler

    def test_signup_sends_a_welcome_mail(db):
        signup("ada@example.com")
        assert_enqueued("send_welcome", input_data={"email": "ada@example.com"})
        assert drain().counts["completed"] == 1

* `enqueued()`, `assert_enqueued()`, `refute_enqueued()`: what is waiting to
  run, by the names of `enqueue()`'s arguments (`input_data` as a subset);
* `run_handler()`: enqueue an item, claim it and call its handler here with a
  real `WorkContext`; `run_item()` does it for an item already enqueued;
* `drain()`: run everything claimable here, one item at a time, through the
  worker's claim and endings, and say what became of each;
* `override_handler()`: swap a handler for the length of a block;
* `InlineWorker` and `LeasingTestMixin` bind them to one database, for the
  pytest fixture `leasing_worker` (`pytest_plugins = ["leasing.testing.pytest"]`)
  and Django's `TestCase`.

Everything works inside the test's transaction (pytest-django's `db`,
`TestCase`) as well as outside it (`transactional_db`, `TransactionTestCase`),
on SQLite and PostgreSQL. See docs/how-to/testing.md.
"""

from .assertions import assert_enqueued, enqueued, refute_enqueued
from .claims import NotClaimable
from .inline import InlineWorker, LeasingTestMixin
from .overrides import override_handler
from .results import COMPLETED, FAILED, HANDED_BACK, LOST, RETRIED, DrainResult, HandlerRun
from .runs import drain, run_handler, run_item
from .transactions import BrokenTransaction

__all__ = [
    "COMPLETED",
    "FAILED",
    "HANDED_BACK",
    "LOST",
    "RETRIED",
    "BrokenTransaction",
    "DrainResult",
    "HandlerRun",
    "InlineWorker",
    "LeasingTestMixin",
    "NotClaimable",
    "assert_enqueued",
    "drain",
    "enqueued",
    "override_handler",
    "refute_enqueued",
    "run_handler",
    "run_item",
]
