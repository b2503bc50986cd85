"""Fast tests that need no database server: pure Python, or SQLite in memory
(`make test-unit`)."""
