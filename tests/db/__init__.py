"""The public API against the database, on SQLite and on PostgreSQL (`make test-db`)."""
