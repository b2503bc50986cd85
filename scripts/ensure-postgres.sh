#!/bin/sh
# Make sure a PostgreSQL server answers at $DATABASE_URL.
# If nothing answers and a local Debian cluster exists but is stopped, start it.
# Otherwise fail with one line saying how to provide one.
set -u
PY="${PY:-.venv/bin/python}"
URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"

probe() {
    "$PY" - "$URL" <<'PYEOF' >/dev/null 2>&1
import sys
import psycopg
from urllib.parse import urlsplit, unquote
u = urlsplit(sys.argv[1])
psycopg.connect(
    host=u.hostname or "127.0.0.1", port=u.port or 5432,
    user=unquote(u.username or "postgres"), password=unquote(u.password or "") or None,
    dbname=(u.path.lstrip("/") or "postgres"), connect_timeout=3,
).close()
PYEOF
}

if probe; then exit 0; fi

if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version name port status rest; do
        case "$status" in
            down*)
                echo "Starting stopped PostgreSQL cluster $version/$name (port $port)..." >&2
                pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start >&2 \
                    || sudo -n pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start >&2 \
                    || true
                ;;
        esac
    done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        if probe; then exit 0; fi
        sleep 1
    done
fi

echo "PostgreSQL is not reachable at $URL: start a server there, or set DATABASE_URL=postgres://USER@HOST:PORT/DB to one whose user may create databases." >&2
exit 1
