"""Rate limits (LEASING RATE_LIMITS, an enqueue's rate_limit) held inside the claim.

Single-process checks on both databases; `tests/process/test_rate_limits_workers.py`
proves the rate with eight worker processes on PostgreSQL.
"""

from __future__ import annotations

import time
from collections import Counter
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command

from leasing import LeaseManager, enqueue, enqueue_many, pause
from leasing.conf import read_settings
from leasing.exceptions import InvalidInput
from leasing.models import RateBucket, WorkItem
from leasing.rates import RateLimit, parse_rate_limit

pytestmark = pytest.mark.django_db

# Three at once, then one a minute: nothing more within a test.
THREE_A_MINUTE = {"limit": 1, "per": 60, "burst": 3}


def items(n: int, *, queue: str = "default", work_type: str = "test.noop", **extra) -> None:
    enqueue_many(
        [
            {
                "task_id": f"{queue}-{extra.get('rate_key')}-{i}",
                "work_type": work_type,
                "queue_name": queue,
                **extra,
            }
            for i in range(n)
        ]
    )


def test_a_key_limit_admits_its_burst_and_leaves_the_rest_pending_uncharged(leasing_settings):
    leasing_settings(RATE_LIMITS={"key:stripe": THREE_A_MINUTE})
    items(10, rate_key="stripe")
    items(4)  # no key: not held back
    leases = LeaseManager("w1").acquire_leases(20)
    assert Counter(lease.task_id.split("-")[1] for lease in leases) == {"stripe": 3, "None": 4}
    waiting = WorkItem.objects.filter(rate_key="stripe", status="pending")
    assert waiting.count() == 7
    # Neither claimed nor charged: no attempt, no retry, no error.
    assert set(waiting.values_list("lease_token", "retry_count", "error_message")) == {(0, 0, None)}
    assert LeaseManager("w2").acquire_leases(20) == []
    bucket = RateBucket.objects.get(bucket="key:stripe")
    assert bucket.admitted == 3


def test_each_rate_key_has_its_own_bucket_so_one_key_does_not_slow_another(leasing_settings):
    leasing_settings(RATE_LIMITS={"key:*": {"limit": 1, "per": 60, "burst": 1}})
    for key in ("a", "b", "c"):
        items(3, rate_key=key)
    leases = LeaseManager("w1").acquire_leases(10)
    assert Counter(lease.task_id.split("-")[1] for lease in leases) == {"a": 1, "b": 1, "c": 1}
    items(1, rate_key="d")
    assert [lease.task_id for lease in LeaseManager("w1").acquire_leases(10)] == ["default-d-0"]


def test_queue_and_work_type_limits_hold_together(leasing_settings):
    leasing_settings(
        RATE_LIMITS={
            "queue:mail": {"limit": 1, "per": 60, "burst": 4},
            "work_type:test.echo": {"limit": 1, "per": 60, "burst": 2},
        }
    )
    items(5, queue="mail", work_type="test.echo")
    items(5, queue="mail")
    items(5, queue="other", work_type="test.echo")
    leases = LeaseManager("w1").acquire_leases(30)
    pairs = Counter((lease.queue_name, lease.work_type) for lease in leases)
    assert sum(n for (q, _), n in pairs.items() if q == "mail") == 4
    assert sum(n for (_, t), n in pairs.items() if t == "test.echo") == 2


def test_a_closed_bucket_opens_again_at_its_rate_and_the_manager_says_when(leasing_settings):
    # One every 2 s and no burst beyond the rate: one at once, then one each 2 s.
    leasing_settings(RATE_LIMITS={"key:k": {"limit": 1, "per": 2, "burst": 1}})
    items(5, rate_key="k")
    manager = LeaseManager("w1")
    assert len(manager.acquire_leases(5)) == 1
    assert manager.acquire_leases(5) == []
    assert manager.rate_wait is not None and 0 < manager.rate_wait <= 2.0
    time.sleep(manager.rate_wait + 0.01)
    assert len(manager.acquire_leases(5)) == 1


def test_an_enqueue_gives_its_key_a_limit(leasing_settings):
    leasing_settings(RATE_LIMITS={"key:*": None})
    enqueue_many(
        [
            {
                "task_id": f"t{i}",
                "work_type": "test.noop",
                "rate_key": "api",
                "rate_limit": "1/m" if i == 0 else None,
            }
            for i in range(5)
        ]
    )
    items(3, rate_key="unlimited")  # no limit of its own and no key:* default
    leases = LeaseManager("w1").acquire_leases(10)
    by_key = Counter(WorkItem.objects.get(pk=lease.work_item_id).rate_key for lease in leases)
    # "1/m": one a minute, and the default burst (a tenth more, at least one) lets two through.
    assert by_key == {"api": 2, "unlimited": 3}
    bucket = RateBucket.objects.get(bucket="key:api")
    assert (bucket.limit_count, bucket.period_seconds, bucket.burst) == (1, 60.0, 2)


def test_rate_limits_combine_with_pauses_and_concurrency_limits(leasing_settings):
    leasing_settings(RATE_LIMITS={"key:*": THREE_A_MINUTE}, QUEUE_LIMITS={"capped": 2})
    items(5, queue="capped", rate_key="a")
    items(5, queue="paused", rate_key="b")
    pause(queue="paused", by="test", reason="test")
    leases = LeaseManager("w1").acquire_leases(20)
    assert [lease.queue_name for lease in leases] == ["capped", "capped"]  # the tighter gate
    # The paused queue's items were not charged to their key's bucket.
    assert not RateBucket.objects.filter(bucket="key:b", admitted__gt=0).exists()


def test_bad_rate_limits_are_reported_by_the_check_and_skipped_at_run_time(leasing_settings):
    leasing_settings(
        RATE_LIMITS={"key:ok": "5/s", "queue:bad": "fast", "nokind": "1/s", "key:b": {"limit": 0}}
    )
    errors = [m for m in run_checks() if m.id == "leasing.E012"]
    assert len(errors) == 3
    conf, _ = read_settings({"RATE_LIMITS": {"key:ok": "5/s", "queue:bad": "fast"}})
    assert conf.rate_limits == {"key:ok": RateLimit(5, 1.0, 6)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("50/s", RateLimit(50, 1.0, 55)),
        ("600/m", RateLimit(600, 60.0, 660)),
        ("5/10s", RateLimit(5, 10.0, 6)),
        ("5/.5s", RateLimit(5, 0.5, 6)),
        ("5/2.s", RateLimit(5, 2.0, 6)),
        ("05/s", RateLimit(5, 1.0, 6)),
        ({"limit": 50, "per": 1, "burst": 50}, RateLimit(50, 1.0, 50)),
    ],
)
def test_rate_limit_forms(text, expected):
    assert parse_rate_limit("r", text) == expected


def test_enqueue_refuses_a_rate_limit_it_cannot_enforce(leasing_settings):
    with pytest.raises(InvalidInput, match="needs a rate_key"):
        enqueue("t", "test.noop", rate_limit="1/s")
    with pytest.raises(InvalidInput, match="RATE_LIMITS"):
        enqueue("t", "test.noop", rate_key="k", rate_limit="1/s")
    leasing_settings(RATE_LIMITS={"key:*": None})
    with pytest.raises(InvalidInput, match="burst"):
        enqueue("t", "test.noop", rate_key="k", rate_limit={"limit": 5, "burst": 2})
    with pytest.raises(InvalidInput, match="rate_key"):
        enqueue("t", "test.noop", rate_key="")
    assert not WorkItem.objects.exists()


def test_the_console_and_metrics_show_each_bucket_its_rate_and_what_waits(
    leasing_settings, admin_client
):
    from leasing.console.rates import rate_table
    from leasing.metrics import render_latest

    leasing_settings(RATE_LIMITS={"key:stripe": THREE_A_MINUTE})
    items(10, rate_key="stripe")
    assert len(LeaseManager("w1").acquire_leases(20)) == 3
    [row] = rate_table()
    assert (row.bucket, row.closed, row.waiting, row.admitted) == ("key:stripe", True, 7, 3)
    assert row.limit == RateLimit(1, 60.0, 3) and row.limit_per_second == pytest.approx(1 / 60)
    assert row.per_second == pytest.approx(0.3)  # 3 in the last 10 s
    assert 0 < row.opens_in_seconds <= 60
    body, _ = render_latest()
    text = body.decode()
    assert 'leasing_rate_closed{bucket="key:stripe"} 1.0' in text
    assert 'leasing_rate_waiting{bucket="key:stripe"} 7.0' in text
    assert 'leasing_rate_admitted_total{bucket="key:stripe"} 3.0' in text
    page = admin_client.get("/admin/leasing/workitem/dashboard/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-bucket="key:stripe" data-closed="yes"' in html


def test_run_item_says_when_a_rate_limit_holds_the_item_back(leasing_settings):
    from leasing.testing import NotClaimable, run_item

    leasing_settings(RATE_LIMITS={"key:stripe": {"limit": 1, "per": 60, "burst": 1}})
    first = enqueue("t1", "test.noop", rate_key="stripe")
    second = enqueue("t2", "test.noop", rate_key="stripe")
    run_item(first)
    with pytest.raises(NotClaimable, match="rate limit's bucket 'key:stripe'"):
        run_item(second)
    assert WorkItem.objects.get(pk=second.work_item_id).status == "pending"


def test_the_console_counts_a_queue_bucket_exactly_and_a_rate_key_up_to_its_cap(
    leasing_settings, monkeypatch, admin_client
):
    from leasing.console import dashboard, rates
    from leasing.console.rates import rate_table

    leasing_settings(RATE_LIMITS={"queue:billing": THREE_A_MINUTE, "key:stripe": THREE_A_MINUTE})
    items(6, queue="billing")
    items(7, rate_key="stripe")
    assert len(LeaseManager("w1").acquire_leases(20)) == 6  # three of each bucket
    rows = {row.bucket: row for row in rate_table(waiting_cap=2)}
    # The queue's from the per-pair pending counts: exact; the key's stops at the cap.
    assert (rows["queue:billing"].waiting, rows["queue:billing"].waiting_capped) == (3, False)
    assert (rows["key:stripe"].waiting, rows["key:stripe"].waiting_capped) == (2, True)
    # Without a cap (what /metrics asks), every one.
    assert {row.bucket: row.waiting for row in rate_table()} == {
        "queue:billing": 3,
        "key:stripe": 4,
    }
    # The dashboard says the count stopped.
    monkeypatch.setattr(dashboard, "WAITING_CAP", 2)
    assert rates.WAITING_CAP == 1000
    html = admin_client.get("/admin/leasing/workitem/dashboard/").content.decode()
    row = html.split('data-bucket="key:stripe"')[1].split("</tr>")[0]
    assert '<td class="num">2+</td>' in row


# Malformed rate texts: each used to pass the pattern and then raise a bare ValueError
# ("5/.s": float('.'); 5,000 digits: int()'s digit limit), or parse (Arabic-Indic digits).
MALFORMED = [
    "5/.s",
    "5/",
    "/s",
    "5/1e999s",
    "nan/s",
    "5/-1s",
    "5/0s",
    "1e400/s",
    "5/..s",
    "\u0665/s",
    "9" * 5000 + "/s",
]


def test_malformed_rate_texts_are_refused_by_enqueue_with_invalid_input(leasing_settings):
    leasing_settings(RATE_LIMITS={"key:*": None})
    for text in MALFORMED:
        with pytest.raises(InvalidInput, match=r"rate_limit(: the (limit|period)| must look)"):
            enqueue("t", "test.noop", rate_key="rk", rate_limit=text)
    assert not WorkItem.objects.exists()
    assert not RateBucket.objects.exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"limit": 5, "per": 10**400}, "r: the period must be a number of seconds"),
        ({"limit": 5, "burst": 10**5000}, "r: the burst must be .* too large to show"),
        ({"limit": 5, "x": 10**5000}, "r must be a dict with 'limit'.* too large to show"),
    ],
    ids=["huge-per", "huge-burst", "huge-unknown-key"],
)
def test_a_dict_limit_with_a_huge_int_is_refused_with_invalid_input(value, message):
    """math.isfinite() overflowed, and repr() of the int in the message raised ValueError."""
    with pytest.raises(InvalidInput, match=message):
        parse_rate_limit("r", value)


def test_malformed_rate_texts_in_the_setting_are_check_errors_one_each(leasing_settings):
    limits = {f"key:k{i}": text for i, text in enumerate(MALFORMED)}
    leasing_settings(RATE_LIMITS={**limits, "key:ok": "5/s"})
    errors = [m for m in run_checks() if m.id == "leasing.E012"]
    assert len(errors) == len(MALFORMED)
    assert all(error.msg.startswith("LEASING['RATE_LIMITS'][") for error in errors)
    conf, problems = read_settings({"RATE_LIMITS": {**limits, "key:ok": "5/s"}})
    assert conf.rate_limits == {"key:ok": RateLimit(5, 1.0, 6)}
    assert len(problems) == len(MALFORMED)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("command", ["runworker", "recoverysweep"])
def test_commands_refuse_a_malformed_rate_text_in_one_line(leasing_settings, command):
    leasing_settings(RATE_LIMITS={"key:rk": "5/.s"})
    enqueue("t", "test.noop")
    with pytest.raises(CommandError) as info:
        call_command(
            command,
            "--once" if command == "recoverysweep" else "--burst",
            stdout=StringIO(),
            stderr=StringIO(),
        )
    text = str(info.value)
    assert text.startswith("leasing.E012: LEASING['RATE_LIMITS']['key:rk'] must look like")
    assert len(text.splitlines()) == 1
    assert WorkItem.objects.get().status == "pending"
