"""``manage.py serve``: gunicorn and the dispatch loop side by side, in the foreground.

This is what ``make run`` ends with. The children share one ``PROMETHEUS_MULTIPROC_DIR``
(``var/metrics`` unless set), so ``/metrics`` sums what every worker and the loop counted. Both run as child processes; Ctrl-C (SIGINT) or SIGTERM
stops both and waits for them, and if either exits on its own the other is stopped too, so
the command never leaves a half-running system behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import get_commands
from django.core.management.base import BaseCommand

from ankusa_site.core.varfiles import private_dir
from commands.dispatch.adapters.http import longest_send_s

# After SIGTERM, a child gets as long as a send may take by the site's timeouts, and this margin to
# record it (or, with the database down, spool it to var/), before it is killed. Killed mid-send,
# the loop leaves the command ``dispatching``: safe (the recovery makes it ``outlook-unknown``,
# never a second send) but a person must look at it.
STOP_MARGIN_S = 10


def stop_grace_s() -> float:
    """How long ``serve`` waits for its children after SIGTERM: the longest send by the site's
    timeouts (a connector may set longer ones), plus the margin."""
    return longest_send_s() + STOP_MARGIN_S


class Command(BaseCommand):
    help = "Run gunicorn and the dispatch loop until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1:8000")
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--threads", type=int, default=4)
        parser.add_argument("--no-dispatch", action="store_true", help="Serve only; no dispatch loop.")

    def handle(self, *args, **options):
        env = self.child_env()
        children = {"web": self.start_web(options, env)}
        if not options["no_dispatch"] and "dispatch" in get_commands():
            children["dispatch"] = subprocess.Popen(
                [sys.executable, str(settings.BASE_DIR / "manage.py"), "dispatch"], env=env
            )
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        self.stdout.write(f"Serving on http://{options['bind']} ({', '.join(children)}); Ctrl-C stops.")
        while not stopping and all(child.poll() is None for child in children.values()):
            time.sleep(0.2)
        exited = [name for name, child in children.items() if child.poll() is not None]
        self.stop_all(children)
        if exited and not stopping:
            self.stderr.write(f"{', '.join(exited)} exited; stopped the rest.")
            sys.exit(1)

    def child_env(self) -> dict[str, str]:
        """The children's environment: one metrics folder for this node, emptied at start."""
        env = os.environ.copy()
        if not env.get("PROMETHEUS_MULTIPROC_DIR"):
            folder = private_dir(settings.VAR_DIR) / "metrics"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(mode=0o700)  # owner-only, as everything under var/ (ankusa_site.core.varfiles)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
        return env

    def start_web(self, options, env) -> subprocess.Popen:
        command = [
            sys.executable, "-m", "gunicorn", "ankusa_site.wsgi",
            "--config", "python:ankusa_site.gunicorn_conf",
            "--bind", options["bind"],
            "--workers", str(options["workers"]),
            "--threads", str(options["threads"]),
            "--access-logfile", "-",
        ]  # fmt: skip
        return subprocess.Popen(command, env=env)

    def stop_all(self, children: dict[str, subprocess.Popen]) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + stop_grace_s()
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
