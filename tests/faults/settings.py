"""Django settings of the fault run's processes: the HA tests' settings plus the run's app.

The database topology and `LEASING` come from the environment exactly as for
`tests.ha.settings` (`HA_DB_*`, `HA_DIRECT_*`, `HA_LEASING`); on top of them:

- `FAULTS_PROC`: the process's name in the run, given to PostgreSQL as the
  connections' `application_name` (so the injector can tell whose backend it
  ends) and written into each signal record;
- `FAULTS_RECORDS`: the directory the process's signal records go to;
- `FAULTS_CLOCK_SKEW`: seconds to move this process's wall clock (tests.faults.clock).
"""

from __future__ import annotations

import os

from tests.faults.clock import skew_from_environment

# First, so that every module imported from here on reads the skewed clock.
skew_from_environment()

from tests.ha.settings import *  # noqa: E402, F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.faults.app"]  # noqa: F405

for _database in DATABASES.values():  # noqa: F405
    _database["OPTIONS"]["application_name"] = "faults:" + os.environ.get("FAULTS_PROC", "-")
