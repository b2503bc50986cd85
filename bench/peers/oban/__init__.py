"""oban-py's side of the `peers` scenario (run from the peers' virtualenv only).

Nothing of Django here: oban-py is not a Django library. Its worker process is
its own CLI (`python -m oban start --dsn ... --queues default:LIMIT`), which
finds the worker class below by its import path (the bench puts the checkout
on PYTHONPATH).
"""
