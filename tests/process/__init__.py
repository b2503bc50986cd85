"""Real processes: `runworker`, `recoverysweep`, `runscheduler`, the demo and new sites,
started, signalled and killed, on SQLite and on PostgreSQL (`make test-process`)."""
