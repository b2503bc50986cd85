"""The statement catalogue: every write to the leasing tables, and the reads that decide one.

Nothing outside this package and the storage boundary (`leasing.storage`)
writes `work_items`, `checkpoints`, `idempotency_keys` or `workers` with SQL
of its own. Each module owns one table's statements and builds them from
pieces written once (the lease fence, each SET list, the status changes of
`leasing.transitions`), and from the fragments of a `Storage` (the database
clock, list parameters, row locks), so they are written once for both
databases; what only one database can say lives in its storage package:

* `runner`      running a statement, translating driver errors, decoding rows;
* `work_items`  the lease fence and SET lists; complete, fail/retry, requeue;
* `terms`       what a claim asks for: its lease terms and filters;
* `candidates`  which pending rows a claim takes (the claim index);
* `pauses`      pausing and resuming queues and work types; the claim's pause check;
* `limits`      concurrency limits inside the claim (counts, branches);
* `recovery`    how the sweep recovers a batch of expired leases;
* `unique`      unique keys: holders, and the guard of every return to pending;
* `dependencies`, `checkpoints`, `idempotency`, `processes`, `schedules`,
  `rollups`, `marks`, `retention`, `renewals`, `new_items`, `snapshots`,
  `wakes`, `operator`: one table or concern each.

The services (`leasing.services`) call these functions and the storage's
operations; the runtimes (worker, sweep) and the edges (admin, commands)
call the services.
"""
