"""``manage.py serve`` stopping its children: each gets as long as a send may take before it is
killed, so the dispatch loop can finish and record the send in flight."""

from __future__ import annotations

import subprocess
import sys
import time

from ankusa_site.management.commands import serve

# A child that needs ``seconds`` after SIGTERM to finish what it holds, then exits 0.
FINISHES_AFTER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *args: (time.sleep({seconds}), sys.exit(0)))
print("ready", flush=True)
time.sleep(60)
"""


def child(seconds: float) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", FINISHES_AFTER.format(seconds=seconds)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "ready\n"
    return process


def test_the_grace_covers_a_whole_send_by_the_sites_timeouts(settings):
    settings.ANKUSA_HTTP_CONNECT_TIMEOUT_S, settings.ANKUSA_HTTP_READ_TIMEOUT_S = 5.0, 30.0
    assert serve.stop_grace_s() == 5.0 + 30.0 + serve.STOP_MARGIN_S


def test_a_child_finishing_a_send_within_the_grace_is_not_killed(settings, monkeypatch):
    settings.ANKUSA_HTTP_CONNECT_TIMEOUT_S, settings.ANKUSA_HTTP_READ_TIMEOUT_S = 0.2, 1.0
    monkeypatch.setattr(serve, "STOP_MARGIN_S", 3.0)
    finishing = child(seconds=1.0)  # a send's read, well under the 4.2 s grace
    serve.Command().stop_all({"dispatch": finishing})
    assert finishing.returncode == 0


def test_a_child_still_busy_after_the_grace_is_killed(settings, monkeypatch):
    settings.ANKUSA_HTTP_CONNECT_TIMEOUT_S, settings.ANKUSA_HTTP_READ_TIMEOUT_S = 0.1, 0.2
    monkeypatch.setattr(serve, "STOP_MARGIN_S", 0.2)
    stuck = child(seconds=30)
    started = time.monotonic()
    serve.Command().stop_all({"dispatch": stuck})
    assert stuck.returncode == -9
    assert time.monotonic() - started < 5
