"""/metrics with real processes: webhooks answered by several gunicorn workers (recycled as they
go) and a separate dispatch process, all summed by one scrape — exactly what the test caused."""

from __future__ import annotations

import http.client
import re
import subprocess
import sys

import pytest
from django.conf import settings

from commands.models import Command

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WEBHOOKS = 12


def value(text: str, name: str, **labels) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = rf"^{re.escape(name)}{re.escape('{' + wanted + '}') if labels else ''} (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found[1]) if found else 0.0


def test_one_scrape_sums_every_worker_and_the_dispatch_process(
    hook_source, start_node, service_env, tmp_path
):
    hook_source.connectors.filter(kind="http").delete()  # only the log connector: sends need no sink
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    # Each worker is replaced after 3 requests: the count must survive the processes that made it.
    node = start_node(workers=2, threads=2, args=("--max-requests", "3"), **env)

    answers = [node.hook(f"metrics-{n}")[0] for n in range(WEBHOOKS)]
    duplicate = node.hook("metrics-0")[0]
    unsigned = node.request("POST", "/hooks/acme/orders/", b"{}", {"Content-Type": "application/json"})[0]
    assert (set(answers), duplicate, unsigned) == ({202}, 200, 401)

    dispatch = subprocess.run(
        [sys.executable, "manage.py", "dispatch", "--once"],
        cwd=settings.BASE_DIR,
        env={**service_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dispatch.returncode == 0, dispatch.stderr
    assert Command.objects.filter(state="succeeded").count() == WEBHOOKS

    scraped = _scrape(node)
    served_by = {int(name.split("_")[-1].split(".")[0]) for name in _files(metrics_dir, "counter_")}
    assert len(served_by) >= 4  # at least two recycled workers, the master's children and dispatch

    assert value(scraped, "ankusa_intake_responses_total", endpoint="hooks", status="202") == WEBHOOKS
    assert value(scraped, "ankusa_intake_responses_total", endpoint="hooks", status="200") == 1
    assert value(scraped, "ankusa_intake_responses_total", endpoint="hooks", status="401") == 1
    assert value(scraped, "ankusa_intake_latency_seconds_count", endpoint="hooks") == WEBHOOKS + 2
    assert value(scraped, "ankusa_dispatch_attempts_total", kind="log", outcome="ok", outlook="") == WEBHOOKS
    assert value(scraped, "ankusa_dispatch_round_seconds_count") == 1
    assert value(scraped, "ankusa_commands", state="succeeded") == WEBHOOKS
    # Node scope: each worker has its own claims, so the repeat may be news to the worker it reached
    # (the database's unique constraint then answers the 200). One store call per signed webhook.
    calls = sum(
        value(scraped, "ankusa_store_calls_total", scope="node", result=r) for r in ("ok", "duplicate")
    )
    assert calls == WEBHOOKS + 1


def _files(folder, prefix):
    return [p.name for p in folder.iterdir() if p.name.startswith(prefix)]


def _scrape(node) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()
