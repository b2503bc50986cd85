"""A view that enqueues, for the tracing tests: one trace from a request to the run."""

from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import leasing


@csrf_exempt
@require_POST
def enqueue_traced(request: HttpRequest) -> JsonResponse:
    data = json.loads(request.body or b"{}")
    item = leasing.enqueue(
        data.get("task_id", "traced"), "test.traced", input_data=data.get("input") or {}
    )
    return JsonResponse({"work_item_id": item.work_item_id}, status=201)
