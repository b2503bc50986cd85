"""Quiet and stop of a worker: the service call and the admin actions (reason, audit, bad input).

That a real worker honours them is tests/process/test_worker_requests.py.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.urls import reverse

from leasing.exceptions import InvalidInput
from leasing.models import Worker
from leasing.services import processes
from tests.support.admin import form_fields, messages_of

pytestmark = pytest.mark.django_db

URL = "/admin/leasing/worker/"


def _worker(worker_id: str = "w-1") -> Worker:
    processes.register(worker_id, heartbeat_interval=5, concurrency=4)
    return Worker.objects.get(pk=worker_id)


def _start(client, action: str, *ids: str):
    url = reverse("admin:leasing_worker_changelist")
    return client.post(url, {"action": action, "_selected_action": list(ids), "index": "0"})


def _confirm(client, page, **changes: str):
    fields = form_fields(page.content.decode(), "leasing-worker-request-form")
    fields.pop("csrfmiddlewaretoken", None)
    for name, value in changes.items():
        fields[name] = [value]
    return client.post(reverse("admin:leasing_worker_changelist"), fields, follow=True)


def test_the_beat_reads_the_request_back_and_a_stop_is_not_turned_into_quiet():
    _worker()
    assert processes.beat("w-1").requested is None
    assert processes.request("w-1", "quiet", by="ops", reason="drain host")
    answer = processes.beat("w-1")
    assert (answer.requested, answer.by, answer.reason) == ("quiet", "ops", "drain host")
    assert processes.request("w-1", "stop", by="ops", reason="maintenance")
    assert not processes.request("w-1", "quiet", by="ops", reason="changed my mind")
    assert processes.beat("w-1").requested == "stop"
    # A new process under the same id starts without its predecessor's request.
    processes.set_status("w-1", "stopped")
    processes.register("w-1", heartbeat_interval=5)
    assert processes.beat("w-1").requested is None


def test_a_request_to_no_live_worker_changes_nothing_and_bad_input_is_refused():
    assert not processes.request("nobody", "stop", by="ops", reason="x")
    _worker()
    processes.set_status("w-1", "stopped")
    assert not processes.request("w-1", "stop", by="ops", reason="x")
    for bad in (
        {"action": "pause"},
        {"reason": " "},
        {"by": ""},
    ):
        kwargs = {"action": "quiet", "by": "ops", "reason": "why", **bad}
        action = kwargs.pop("action")
        with pytest.raises(InvalidInput):
            processes.request("w-1", action, **kwargs)


def test_quiet_from_the_admin_asks_a_reason_records_it_and_logs_it(operator_client):
    _worker()
    page = _start(operator_client, "quiet_selected", "w-1")
    assert page.status_code == 200
    assert "admin/leasing/worker/request_confirmation.html" in [t.name for t in page.templates]
    assert Worker.objects.get().requested_action is None  # nothing before confirming

    empty = _confirm(operator_client, page, reason="")
    assert "Give a reason" in empty.content.decode()
    assert Worker.objects.get().requested_action is None

    done = _confirm(operator_client, page, reason="draining web-1 for a kernel update")
    assert "1 worker asked to go quiet; each sees it at its next beat." in messages_of(done)
    worker = Worker.objects.get()
    assert (worker.requested_action, worker.requested_by) == ("quiet", "operator")
    assert worker.request_reason == "draining web-1 for a kernel update"
    assert worker.requested_at is not None
    entry = LogEntry.objects.get()
    assert entry.object_id == "w-1" and entry.action_flag == CHANGE
    assert "draining web-1" in entry.get_change_message()
    detail = operator_client.get(reverse("admin:leasing_worker_change", args=["w-1"]))
    assert "Quiet by operator" in detail.content.decode()


def test_stop_of_a_stopped_worker_is_reported_not_applied(operator_client):
    _worker()
    page = _start(operator_client, "stop_selected", "w-1")
    processes.set_status("w-1", "stopped")
    done = _confirm(operator_client, page, reason="maintenance")
    assert any("was not asked to stop" in m for m in messages_of(done))
    assert Worker.objects.get().requested_action is None
    assert not LogEntry.objects.exists()


def test_a_viewer_is_not_offered_the_actions_and_cannot_post_them(viewer_client):
    _worker()
    page = viewer_client.get(URL)
    assert page.status_code == 200
    assert "quiet_selected" not in page.content.decode()
    _start(viewer_client, "quiet_selected", "w-1")
    assert Worker.objects.get().requested_action is None


def test_the_workers_list_shows_busy_idle_and_abandoned_runs(operator_client):
    from leasing.sql.processes import RunReport

    _worker()
    processes.beat("w-1", runs=RunReport(busy=3, abandoned=2, newly_abandoned=2))
    page = operator_client.get(URL).content.decode()
    assert "3 busy, 1 idle" in page
    assert "2 abandoned" in page
    assert Worker.objects.get().runs_abandoned_total == 2


def test_the_start_up_line_gives_each_work_types_own_lease_and_heartbeat(caplog):
    """A type with a 45 s lease is not announced with the 300 s default."""
    from leasing.handlers import HandlerRegistry
    from leasing.worker import WorkerOptions, WorkerRuntime
    from leasing.worker.options import resolve

    handlers = HandlerRegistry()
    handlers.register("quick", lambda ctx: None, lease_duration=45, heartbeat_interval=5)
    handlers.register("default", lambda ctx: None)
    config = resolve(WorkerOptions(burst=True, worker_id="w-start"), handlers)
    with caplog.at_level("INFO", logger="leasing.worker"):
        WorkerRuntime(config).run()
    [line] = [r.getMessage() for r in caplog.records if " started: " in r.getMessage()]
    assert "quick (lease 45s, heartbeat 5s)" in line, line
    assert "default (lease 300s, heartbeat 30s)" in line, line


def test_the_dashboard_worker_rows_show_runs_and_requests(operator_client):
    from leasing.sql.processes import RunReport
    from tests.support.admin import dashboard_url

    _worker()
    processes.beat("w-1", runs=RunReport(busy=1, abandoned=1, newly_abandoned=1, quiet=True))
    processes.request("w-1", "stop", by="ops", reason="maintenance")
    page = operator_client.get(dashboard_url()).content.decode()
    row = page[page.index('data-worker="w-1"') :]
    row = row[: row.index("</tr>")]
    assert "1 busy, 3 idle" in row
    assert "1 abandoned" in row
    assert "stop requested" in row and "maintenance" in row


def test_bad_input_to_the_actions_gets_a_message_not_a_server_error(operator_client):
    _worker()
    page = _start(operator_client, "quiet_selected", "w\x00-1")
    assert page.status_code == 302
    assert Worker.objects.get().requested_action is None
    page = _start(operator_client, "quiet_selected", "w-1")
    done = _confirm(operator_client, page, reason="bad \x00 byte")
    assert done.status_code == 200
    assert Worker.objects.get().requested_action is None


def test_stop_of_a_lost_worker_says_it_is_lost_not_that_it_will_see_it(operator_client):
    _worker()
    Worker.objects.filter(pk="w-1").update(status="lost")  # killed; the sweep marked it lost
    page = _start(operator_client, "stop_selected", "w-1")
    done = _confirm(operator_client, page, reason="it was killed")
    said = messages_of(done)
    assert not any("sees it at its next beat" in m for m in said), said
    assert any("w-1 is lost" in m and "only if it comes back" in m for m in said), said
    assert Worker.objects.get().requested_action == "stop"  # kept for a process that returns
