"""The peers of the `peers` benchmark scenario: procrastinate, django-tasks-db, django-q2.

They run from a bench-only virtualenv (`bench.peers.venv`), never from the
project's: `bench.peers.site` is a minimal Django site with all three
installed the way their documentation sets them up, and one no-op task each.
Nothing in this package imports the leasing app.
"""
