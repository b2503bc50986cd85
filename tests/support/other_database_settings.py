"""Settings of the subprocesses of tests/process/test_tasks_other_database.py.

The test database (DATABASE_URL) is the alias "other", which the Tasks backend
"elsewhere" enqueues to; "default" is a database of their own with the leasing tables
(LEASING_TEST_DEFAULT_URL), so a worker of the default alias finds none of its tasks.
"""

import os

from project.settings import _database_from_url
from tests.settings import *  # noqa: F403

DATABASES = {
    "default": _database_from_url(os.environ["LEASING_TEST_DEFAULT_URL"]),
    "other": DATABASES["default"],  # noqa: F405
}

TASKS = {
    **TASKS,  # noqa: F405
    "elsewhere": {
        "BACKEND": "leasing.tasks.LeasingBackend",
        "QUEUES": [],
        "OPTIONS": {"DATABASE": "other"},
    },
}
