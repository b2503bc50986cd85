"""The new-user test: a fresh site adds leasing exactly as README.md says.

    python scripts/new_user.py sqlite
    python scripts/new_user.py postgres --database-url postgres://postgres@127.0.0.1:5432/x

Builds the wheel of this repository, creates a virtualenv and a
`django-admin startproject` site in a temporary directory, installs the wheel
with the README's extras and applies the README's "Add it to your project"
snippets (INSTALLED_APPS, urls.py, the database settings, taken from the
README itself), migrates, enqueues 400 items whose handler writes three
checkpoints each, runs two `runworker --burst --concurrency 8` at once and
`recoverysweep --once`, then fetches the admin dashboard (logged in) and
/metrics from `runserver`. It checks that the wheel holds only `leasing`,
that all 400 items completed (none failed, none left in progress) with their
1,200 checkpoints, and that both pages answer.

For PostgreSQL the site gets its own database (`<name>_newuser_<pid>`) on the
server of --database-url, dropped afterwards. Wheels of the dependencies are
kept in .cache/wheelhouse, so a second run installs without the network.
Exit status 0 when every check held; otherwise the failed check on stderr.
"""

from __future__ import annotations

import argparse
import fcntl
import http.cookiejar
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CACHE = ROOT / ".cache"
ITEMS = 400
CHECKPOINTS_PER_ITEM = 3
PASSWORD = "new-user-test-pw-1"

HANDLERS = """\
from leasing import handler


@handler("newuser.three_checkpoints")
def three_checkpoints(ctx):
    for step in range(3):
        ctx.checkpoint("iteration_end", {"step": step + 1, "n": ctx.input["n"]})
    return {"n": ctx.input["n"], "steps": 3}
"""

ENQUEUE = f"""\
from leasing import enqueue_many

enqueue_many(
    {{"task_id": f"newuser-{{n}}", "work_type": "newuser.three_checkpoints",
      "input_data": {{"n": n}}}}
    for n in range({ITEMS})
)
"""

COUNT = """\
import json
from leasing.models import Checkpoint, WorkItem
statuses = {s: WorkItem.objects.filter(status=s).count()
            for s in ("pending", "in_progress", "completed", "failed")}
iteration_ends = Checkpoint.objects.filter(checkpoint_type="iteration_end").count()
print(json.dumps({"statuses": statuses, "iteration_ends": iteration_ends}))
"""


class Failed(Exception):
    pass


STARTED = time.monotonic()


def step(message: str) -> None:
    print(f"new-user: [{time.monotonic() - STARTED:5.1f} s] {message}", flush=True)


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise Failed(
            f"`{' '.join(map(str, args))}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


# --- the README --------------------------------------------------------------------------


def readme_section() -> str:
    text = README.read_text()
    start = text.index("## Add it to your project")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def code_blocks(section: str) -> list[str]:
    return re.findall(r"```(?:\w+)?\n(.*?)```", section, re.DOTALL)


def readme_block(containing: str) -> str:
    for block in code_blocks(readme_section()):
        if containing in block:
            return block
    raise Failed(f"README.md's 'Add it to your project' has no code block with {containing!r}")


def readme_extras() -> str:
    match = re.search(r'pip install "django-leasing\[([\w,]+)\]"', readme_section())
    if not match:
        raise Failed("README.md's 'Add it to your project' has no pip install line with extras")
    return match.group(1)


# --- wheel and virtualenv ---------------------------------------------------------------


def build_wheel(work: Path) -> Path:
    # From a copy of what the wheel is made of: a build in the repository would
    # leave build/lib behind, whose stale modules a later wheel would pick up.
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "leasing", source / "leasing", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = work / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        cwd=work,
    )
    [wheel] = dist.glob("django_leasing-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/")[0] for name in archive.namelist()}
    strays = {t for t in top if t != "leasing" and not t.endswith(".dist-info")}
    if strays:
        raise Failed(f"the wheel installs more than leasing: {sorted(strays)}")
    return wheel


def make_venv(work: Path, wheel: Path, extras: str) -> Path:
    venv = work / "venv"
    # No pip inside: this interpreter's pip installs into it (faster than ensurepip).
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    python = venv / "bin" / "python"
    wheelhouse = CACHE / "wheelhouse"
    requirement = f"{wheel}[{extras}]"
    # The dependencies come from the wheelhouse, filled from the package index
    # the first time (and again whenever it lacks something).
    offline = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "-q",
        "--no-compile",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        requirement,
    ]
    quiet = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    try:
        run(offline, cwd=work, env=quiet)
    except Failed:
        wheelhouse.mkdir(parents=True, exist_ok=True)
        # Both passes of make test start here at once on a fresh machine: one fills
        # the wheelhouse while the other waits, then finds it full (a wheel being
        # written is not one to install from).
        with open(CACHE / "wheelhouse.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                run(offline, cwd=work, env=quiet)
            except Failed:
                fill = ["wheel", "-q", "-w", str(wheelhouse), requirement]
                run([sys.executable, "-m", "pip", *fill], cwd=work)
                # Only the dependencies belong there: each run builds the app afresh.
                for stale in wheelhouse.glob("django_leasing-*.whl"):
                    stale.unlink()
                run(offline, cwd=work, env=quiet)
    return python


# --- the site -----------------------------------------------------------------------------


def make_site(work: Path, python: Path, database: str, database_url: str | None) -> Path:
    site = work / "site"
    site.mkdir()
    run([str(python), "-m", "django", "startproject", "mysite", str(site)], cwd=work)
    run([str(python), "manage.py", "startapp", "newuserapp"], cwd=site)
    (site / "newuserapp" / "handlers.py").write_text(HANDLERS)

    settings = site / "mysite" / "settings.py"
    text = settings.read_text()
    apps = "    'django.contrib.staticfiles',\n]"
    if apps not in text:
        raise Failed("startproject's INSTALLED_APPS changed shape")
    # README step 2: "leasing" (and the site's own app) in INSTALLED_APPS.
    readme_apps = readme_block("INSTALLED_APPS")
    if '"leasing",' not in readme_apps:
        raise Failed("README's INSTALLED_APPS block does not add leasing")
    text = text.replace(
        apps, "    'django.contrib.staticfiles',\n    'leasing',\n    'newuserapp',\n]"
    )
    # README step 3: the database settings, appended as the README shows them.
    if database == "sqlite":
        block = readme_block('"django.db.backends.sqlite3"')
    else:
        block = readme_block('"django.db.backends.postgresql"')
        parts = urllib.parse.urlsplit(database_url or "")
        block += (
            "DATABASES['default'].update(NAME={!r}, USER={!r}, PASSWORD={!r}, HOST={!r}, "
            "PORT={!r})\n"
        ).format(
            parts.path.lstrip("/"),
            urllib.parse.unquote(parts.username or "postgres"),
            urllib.parse.unquote(parts.password or ""),
            parts.hostname or "127.0.0.1",
            parts.port or 5432,
        )
    text += "\n# Added as README.md says:\n" + block
    settings.write_text(text)

    # README step 2: the urls.py block replaces startproject's urls.py.
    urls = readme_block('include("leasing.urls")')
    (site / "mysite" / "urls.py").write_text(urls)
    return site


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failed(f"runserver exited {proc.returncode}: {proc.stderr.read()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise Failed("runserver did not start listening")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch_pages(site: Path, python: Path, env: dict[str, str]) -> None:
    run(
        [
            str(python),
            "manage.py",
            "createsuperuser",
            "--noinput",
            "--username",
            "admin",
            "--email",
            "admin@example.com",
        ],
        cwd=site,
        env={**env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD},
    )
    port = free_port()
    server = subprocess.Popen(
        [str(python), "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=site,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_port(port, server)
        base = f"http://127.0.0.1:{port}"
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login = opener.open(f"{base}/admin/login/", timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login)
        if not token:
            raise Failed("the admin login page has no CSRF token")
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token.group(1),
                "username": "admin",
                "password": PASSWORD,
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/admin/login/", data=form, headers={"Referer": f"{base}/admin/login/"}
        )
        opener.open(request, timeout=30).read()
        dashboard = opener.open(f"{base}/admin/leasing/workitem/dashboard/", timeout=60)
        page = dashboard.read().decode()
        if dashboard.status != 200 or "Lease health" not in page:
            raise Failed(f"the dashboard answered {dashboard.status} without its lease tiles")
        if "/admin/login/" in dashboard.url:
            raise Failed("the dashboard sent the logged-in superuser to the login page")
        metrics = opener.open(f"{base}/metrics", timeout=60)
        body = metrics.read().decode()
        expected = f'leasing_work_items{{status="completed"}} {float(ITEMS)}'
        if metrics.status != 200 or expected not in body:
            raise Failed(f"/metrics answered {metrics.status} without `{expected}`:\n{body[:2000]}")
        step("dashboard and /metrics answered as a logged-in superuser")
    finally:
        server.terminate()
        try:
            server.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate(timeout=30)
        step("runserver stopped")


def drive(work: Path, database: str, database_url: str | None) -> None:
    extras = readme_extras()
    step(f"building the wheel; installing it with [{extras}] into a fresh virtualenv")
    wheel = build_wheel(work)
    python = make_venv(work, wheel, extras)
    site = make_site(work, python, database, database_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    env.pop("PYTHONPATH", None)
    env["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    manage = [str(python), "manage.py"]

    step(f"startproject site at {site}; migrate")
    run([*manage, "check"], cwd=site, env=env)
    run([*manage, "migrate", "-v", "0"], cwd=site, env=env)
    run([*manage, "shell", "-c", ENQUEUE], cwd=site, env=env)

    step(f"{ITEMS} items enqueued; two runworker --burst --concurrency 8")
    started = time.monotonic()
    workers = [
        subprocess.Popen(
            [*manage, "runworker", "--burst", "--concurrency", "8"],
            cwd=site,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    for worker in workers:
        try:
            out, err = worker.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in workers:
                other.kill()
            raise Failed("a burst worker was still running after 300 s") from None
        outputs.append((worker.returncode, out, err))
    for code, out, err in outputs:
        step(f"worker exited {code}: {out.strip().splitlines()[-1] if out.strip() else ''}")
        if code != 0:
            raise Failed(f"runworker --burst exited {code}:\n{err[-3000:]}")
    step(f"workers done in {time.monotonic() - started:.1f} s; recoverysweep --once")
    sweep = run([*manage, "recoverysweep", "--once"], cwd=site, env=env)
    step(f"sweep: {sweep.stdout.strip()}")

    counted = run([*manage, "shell", "-c", COUNT], cwd=site, env=env).stdout
    counts = json.loads(counted.strip().splitlines()[-1])
    step(
        f"items by status: {counts['statuses']}; iteration_end checkpoints: "
        f"{counts['iteration_ends']}"
    )
    fetch_pages(site, python, env)
    statuses = counts["statuses"]
    problems = []
    if statuses["completed"] != ITEMS:
        problems.append(f"{statuses['completed']} completed, expected {ITEMS}")
    if statuses["failed"]:
        problems.append(f"{statuses['failed']} failed")
    if statuses["in_progress"]:
        problems.append(f"{statuses['in_progress']} left in progress")
    if counts["iteration_ends"] < ITEMS * CHECKPOINTS_PER_ITEM:
        problems.append(
            f"{counts['iteration_ends']} checkpoints, expected {ITEMS * CHECKPOINTS_PER_ITEM}"
        )
    if problems:
        worker_logs = "\n".join(err[-2000:] for _code, _out, err in outputs)
        raise Failed("; ".join(problems) + f"\nworker logs (tails):\n{worker_logs}")


def postgres_database(url: str) -> tuple[str, str]:
    """A fresh database beside the one of `url`: (its URL, its name)."""
    parts = urllib.parse.urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'leasing'}_newuser_{os.getpid()}"
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}")), name


def admin_sql(url: str, statement: str) -> None:
    import psycopg
    from psycopg import sql

    parts = urllib.parse.urlsplit(url)
    maintenance = urllib.parse.urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(sql.SQL(statement))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=["sqlite", "postgres"])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--keep", action="store_true", help="Keep the temporary directory.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix=f"leasing-new-user-{args.database}-"))
    site_url = name = None
    try:
        if args.database == "postgres":
            if not args.database_url or not args.database_url.startswith("postgres"):
                raise Failed("postgres needs --database-url postgres://... (or DATABASE_URL)")
            site_url, name = postgres_database(args.database_url)
            admin_sql(args.database_url, f'DROP DATABASE IF EXISTS "{name}"')
            admin_sql(args.database_url, f'CREATE DATABASE "{name}"')
        drive(work, args.database, site_url)
    except Failed as exc:
        print(f"new-user: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if name is not None:
            admin_sql(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if args.keep:
            print(f"new-user: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    step("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
