"""Test settings: the project's, plus the handlers the test suite runs."""

from project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405

# Fast, deterministic hashing for the admin users the tests create.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
