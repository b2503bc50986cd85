#!/bin/sh
# The HA tests (make test-ha) need Debian's PostgreSQL server tools, pgbouncer,
# iproute2 (ip netns, tc) and root. Install the packages that are missing.
set -u
need=""
command -v pg_createcluster >/dev/null 2>&1 || need="$need postgresql-common"
command -v pg_basebackup >/dev/null 2>&1 || need="$need postgresql-15"
[ -x /usr/lib/postgresql/15/bin/postgres ] || need="$need postgresql-15"
command -v pgbouncer >/dev/null 2>&1 || need="$need pgbouncer"
command -v ip >/dev/null 2>&1 || need="$need iproute2"
command -v tc >/dev/null 2>&1 || need="$need iproute2"
command -v runuser >/dev/null 2>&1 || need="$need util-linux"
if [ "$(id -u)" != "0" ]; then
    echo "make test-ha needs root (it creates clusters, network namespaces and a pooler)." >&2
    exit 1
fi
if [ -n "$need" ]; then
    echo "Installing Debian packages for the HA tests:$need" >&2
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    apt-get install -y -q $need >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $need >/dev/null; } \
        || { echo "could not install:$need" >&2; exit 1; }
fi
# pgbouncer's Debian package may start a system-wide instance; the tests run
# their own on spare ports and leave that one alone.
exit 0
