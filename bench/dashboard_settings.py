"""Settings of bench/dashboard.py: the project's, with the console's optional panels on.

The bench process and its `runworker` processes share them: a fair queue (media, whose
items carry fairness keys), rate limits (a queue, a demo work type the trickle feeds, and
every rate key) and a trace URL, so that the dashboard's fair queues and rate limits
panels and the item page's trace link are timed as a site that uses them renders them.
"""

from project.settings import *  # noqa: F403

LEASING = {
    **LEASING,  # noqa: F405
    "FAIR_QUEUES": ["media"],
    "RATE_LIMITS": {
        "queue:billing": "50/s",
        "work_type:demo.sleep": "20/s",
        "key:*": "10/s",
    },
    "TRACE_URL": "https://jaeger.example/trace/{trace_id}",
}
