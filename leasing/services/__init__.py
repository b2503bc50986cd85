"""The services: every state change of the leasing tables, through the statement catalogue.

Each module owns one concern and is the only caller of its statements:

* `leases`      `LeaseManager`: claim, renew, release, requeue (fenced by holder and token);
* `completion`  completing finished items in batches, isolating a bad row;
* `endings`     an attempt that failed, was interrupted or timed out, with its checkpoint;
* `enqueue`     `enqueue()`, `enqueue_many()`;
* `checkpoints` appending checkpoints, `resume_state()`, retention;
* `idempotency` `run_once()`;
* `operations`  operator actions (force-release, force-fail, retry);
* `pauses`      `pause()`, `resume()`: stop and restart claims of a queue or work type;
* `processes`   worker and sweep processes in the `workers` table;
* `retention`   purging finished items;
* `rollups`     the hourly rollup of finished items the console's day and week read;
* `held`, `terms` the lease value types and the validated claim terms.

The runtimes (`leasing.worker`, `leasing.sweep`) and the edges (admin,
commands, the Tasks backend) call these; nothing here imports them.
"""
