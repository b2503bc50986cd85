"""The statement catalogue: every write to the leasing tables, and the reads that decide one.

Nothing outside this package writes `work_items`, `checkpoints`,
`idempotency_keys` or `workers` with SQL of its own. Each module owns one
table's statements and builds them from pieces written once (the lease fence,
each SET list, the database clock), so a change to a transition is one edit:

* `dialect`     the database clock in each dialect and the one signed offset helper;
* `runner`      running a statement, translating driver errors, decoding rows;
* `work_items`  claim, complete, fail/retry, requeue, renew, time out, operator
                transitions, the NOTIFY that wakes idle workers;
* `terms`       what a claim asks for: its lease terms and filters;
* `candidates`  which pending rows a claim takes (the claim index, or per-type branches);
* `pauses`      pausing and resuming queues and work types; the claim's pause check;
* `limits`      concurrency limits inside the claim (counts, branches, advisory locks);
* `recovery`    the sweep's recovery of expired leases, with its checkpoints;
* `checkpoints` appending checkpoints (fenced by a lease or not), retention;
* `idempotency` claiming, taking over and finishing idempotency keys;
* `processes`   the `workers` table: register, beat, scans, status, lost;
* `wakes`       which idle worker answers a wake (the lead's advisory lock, the handoff).

The services (`leasing.services`) call these functions; the runtimes (worker,
sweep) and the edges (admin, commands) call the services.
"""
