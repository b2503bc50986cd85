"""Stop signals are acted on by a thread of their own, never inside the signal handler.

Python runs a handler in the main thread between two bytecodes, possibly while
that thread holds a lock; an action that takes the same lock would wait for
itself and the process would never stop (a worker hung on SIGTERM this way).
Each case runs in a fresh interpreter, so a deadlock fails it by its timeout
instead of hanging the suite.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the process did not finish within {timeout}s: {exc.output}") from exc


def test_a_signal_landing_while_the_main_thread_holds_the_actions_lock_is_acted_on():
    done = run(
        """
        import os, signal, threading
        from leasing.threads import SignalThread

        lock = threading.Lock()
        acted = threading.Event()

        def on_signal(signum):
            with lock:  # what an Event.set() does with the Event's own lock
                print("acted", signal.Signals(signum).name, threading.current_thread().name)
            acted.set()

        signals = SignalThread(on_signal)
        assert signals.install()
        with lock:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):  # the handler runs between these bytecodes
                pass
        assert acted.wait(10), "not acted on"
        signals.restore()
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["acted", "SIGTERM", "signals"]


def test_with_second_is_default_a_second_signal_ends_the_process_at_once():
    done = run(
        """
        import os, signal, threading
        from leasing.threads import SignalThread

        seen = []
        first = threading.Event()
        signals = SignalThread(lambda signum: (seen.append(signum), first.set()),
                               second_is_default=True)
        assert signals.install()
        os.kill(os.getpid(), signal.SIGINT)
        assert first.wait(10)
        print("first", seen, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # the default action: the process ends here
        time.sleep(10)
        print("survived")
        """
    )
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
    assert done.stdout.splitlines() == [f"first [{int(signal.SIGINT)}]"]


def test_every_signal_reaches_the_action_without_second_is_default():
    done = run(
        """
        import os, signal, threading
        from leasing.threads import SignalThread

        seen = []
        two = threading.Semaphore(0)
        signals = SignalThread(lambda signum: (seen.append(signum), two.release()))
        assert signals.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert two.acquire(timeout=10)
        os.kill(os.getpid(), signal.SIGINT)
        assert two.acquire(timeout=10)
        print(seen)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{int(signal.SIGTERM)}, {int(signal.SIGINT)}]"


def test_restore_puts_the_previous_handlers_back_and_ends_the_thread():
    done = run(
        """
        import signal, threading
        from leasing.threads import SignalThread

        def mine(signum, frame):
            pass

        signal.signal(signal.SIGTERM, mine)
        before = signal.getsignal(signal.SIGINT)  # what the parent left (ignored under nohup)
        signals = SignalThread(lambda signum: None)
        assert signals.install()
        assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGINT) is not before
        relay = next(t for t in threading.enumerate() if t.name == "signals")
        signals.restore()
        relay.join(10)
        print(signal.getsignal(signal.SIGTERM) is mine,
              signal.getsignal(signal.SIGINT) is before,
              relay.is_alive())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False"]


def test_outside_the_main_thread_nothing_is_installed():
    done = run(
        """
        import signal, threading
        from leasing.threads import SignalThread

        answers = []
        before = signal.getsignal(signal.SIGTERM)
        thread = threading.Thread(target=lambda: answers.append(SignalThread(print).install()))
        thread.start()
        thread.join()
        print(answers, signal.getsignal(signal.SIGTERM) is before,
              [t.name for t in threading.enumerate()])
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[False] True ['MainThread']"


def test_installing_twice_keeps_one_thread():
    done = run(
        """
        import os, signal, threading
        from leasing.threads import SignalThread

        seen = []
        acted = threading.Event()
        signals = SignalThread(lambda signum: (seen.append(signum), acted.set()))
        assert signals.install() and signals.install()
        relays = [t.name for t in threading.enumerate() if t.name == "signals"]
        os.kill(os.getpid(), signal.SIGTERM)
        assert acted.wait(10)
        print(relays, seen)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"['signals'] [{int(signal.SIGTERM)}]"
