"""Take the console screenshot of the README and the docs (docs/img/console.png).

    .venv/bin/python docs/tools/screenshot.py [--out docs/img/console.png] [--port 8765]

Starts `manage.py demo` (the demo data set, a worker and the sweep) on a
throwaway SQLite database, logs in as the demo superuser with Debian's
Chromium driven by Playwright (never a browser Playwright downloads), and
saves the dashboard. The demo is stopped with SIGINT, as Ctrl-C would.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("LEASING_CHROMIUM", "/usr/bin/chromium")


def wait_for_port(port: int, demo: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            raise SystemExit(f"the demo exited with {demo.returncode} before serving")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise SystemExit(f"nothing answered on port {port} within {timeout:g} s")


def capture(port: int, out: Path, settle: float) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            base = f"http://127.0.0.1:{port}"
            page.goto(f"{base}/admin/login/?next=/admin/leasing/workitem/dashboard/")
            page.fill("#id_username", "demo")
            page.fill("#id_password", "leasing-demo")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/leasing/workitem/dashboard/")
            time.sleep(settle)  # let the demo's worker finish a few items first
            page.reload()
            # The admin's app list would take a third of the picture: fold it away.
            toggle = page.locator("#toggle-nav-sidebar")
            if toggle.count() and toggle.is_visible():
                toggle.click()  # remembered by the admin: the next load keeps it folded
                page.goto(page.url)
            page.evaluate("window.scrollTo(0, 0)")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "console.png")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--settle", type=float, default=5.0, help="Seconds before the shot.")
    args = parser.parse_args()
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    with tempfile.TemporaryDirectory(prefix="leasing-screenshot-") as work:
        env = {
            **os.environ,
            "DEBUG": "1",
            "DATABASE_URL": f"sqlite:///{work}/demo.sqlite3",
        }
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", str(args.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for_port(args.port, demo)
            capture(args.port, args.out, args.settle)
        finally:
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                demo.kill()
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
