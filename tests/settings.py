"""Test settings: the project's, plus the handlers the test suite runs."""

import json
import os

from project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405

# Fast, deterministic hashing for the admin users the tests create.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The suite enqueues many work types that no handler serves (a claim or sweep
# test needs no handler). Refusing such types is tested with this set to False.
LEASING = {**LEASING, "ALLOW_UNREGISTERED_TYPES": True}  # noqa: F405

# Worker subprocesses of a test can be given extra LEASING keys as JSON
# (say the concurrency limits): LEASING_TEST_SETTINGS='{"QUEUE_LIMITS": {"q": 3}}'.
if os.environ.get("LEASING_TEST_SETTINGS"):
    LEASING = {**LEASING, **json.loads(os.environ["LEASING_TEST_SETTINGS"])}

# A worker subprocess of the tracing tests traces with OpenTelemetry's SDK and appends its
# spans to this file (tests/support/tracing.py).
if os.environ.get("LEASING_TEST_TRACE_FILE"):
    from tests.support.tracing import install_file_exporter

    LEASING = {**LEASING, "TRACING": True}
    install_file_exporter(os.environ["LEASING_TEST_TRACE_FILE"])

# `make test` runs the PostgreSQL pass as jobs at once (the Makefile's
# TEST_PASS_JOBS): each gets its own test database, test_<name><suffix>, so that
# none creates or drops another's.
if os.environ.get("LEASING_TEST_DB_SUFFIX") and DATABASES["default"]["ENGINE"].endswith(  # noqa: F405
    "postgresql"
):
    _default = DATABASES["default"]  # noqa: F405
    _default["TEST"] = {
        **_default.get("TEST", {}),
        "NAME": f"test_{_default['NAME']}{os.environ['LEASING_TEST_DB_SUFFIX']}",
    }
