"""A worker with LEASING["TRACING"] off (the default) and opentelemetry installed: it enqueues
an item whose handler checkpoints and calls run_once, runs it with `runworker --burst`, and
prints one JSON line: {"status": ..., "opentelemetry": [modules of it imported]}.

Usage: python -m tests.procs.tracing_off   (DJANGO_SETTINGS_MODULE, DATABASE_URL set)
"""

from __future__ import annotations

import io
import json
import sys


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    import leasing
    from leasing.models import WorkItem

    item = leasing.enqueue("tracing-off", "test.traced")
    call_command("runworker", "--burst", "--concurrency", "1", stdout=io.StringIO())
    status = WorkItem.objects.get(pk=item.pk).status
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
    print(json.dumps({"status": status, "opentelemetry": loaded}))


if __name__ == "__main__":
    main()
