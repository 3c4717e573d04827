"""Benchmark: the admin's failed-command list with 100,000 failed commands against 1,000.

    [DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db>] .venv/bin/python bench/admin.py [--quick]

It creates its own throw-away database (Django's test database for ``DATABASE_URL``, named
``bench_admin_<pid>`` and dropped at the end), logs a superuser in with Django's test client, and
measures the server time of one render of the failed list's first page with the default filters
(the whole request: middleware, the admin view, its queries, the template):

* ``ms_small`` — with ``SMALL`` failed commands (1,000; 100 with ``--quick``), the baseline;
* ``ms_large`` — with ``LARGE`` failed commands (100,000; 2,000 with ``--quick``);
* ``failed_list_100k_vs_1k`` = large / small. Target ≤ 1.5: the page reads one index range (the
  partial index ``commands_failed_idx``), counts at most 10,001 rows (``CappedPaginator``) and
  never the whole list.
* ``after_fix_100k_vs_1k`` — the same ratio for the list filtered to ``after-fix`` (a fifth of
  the rows): the filter staff use most after an incident. Reported, no target.
* ``connector_list_100k_vs_1k`` — the connector list (each connector's failing and waiting counts,
  capped at 100, its last error, its 24-hour success rate). Target ≤ 1.5.
* ``payload_search_100k_vs_1k`` — the command list searched for a reference in the payload
  (``?q=R000517``: one match at either size, so both draw one row). Target ≤ 1.5 on PostgreSQL,
  whose trigram index serves it; SQLite scans the newest 20,000 commands (``commands.staff.search``), so
  there it is reported.

Each size is rendered in rounds (5, or 2 with ``--quick``) of several renders; the small size is
measured before the large fill and again after the large rows are deleted, and each keeps its best
render: the machine is shared, and a render another process slowed down says nothing about the
code. ``queries_small`` / ``queries_large`` are the SQL statements of one render (they must match).

Prints a table, then one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret-" + "x" * 32)
# WhiteNoise warns that collectstatic has not run; the bench renders pages, it serves no files.
warnings.filterwarnings("ignore", message="No directory at")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import (  # noqa: E402
    CaptureQueriesContext,
    setup_databases,
    setup_test_environment,
    teardown_databases,
)
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from commands.models import Command, Connector  # noqa: E402
from commands.states import State  # noqa: E402
from limits.models import Tenant  # noqa: E402

BATCH = 5000
# A realistic mix: why commands wait, what the adapter said, which error — so the filters'
# choices and the badges have something to show.
MIX = [
    ("after-fix", "backing-off", "HTTPStatus", "HTTP 401 from the receiver"),
    ("again", "attempts-spent", "ConnectTimeoutError", "connection timed out after 5 s"),
    ("never", "never", "HTTPStatus", "HTTP 422: ITEM-1 is not a valid item"),
    ("", "outlook-unknown", "WorkerLost", "the worker stopped during the send"),
    ("again", "not-idempotent", "HTTPStatus", "HTTP 503 from the receiver"),
]


def fill(connectors: list[Connector], start: int, n: int) -> None:
    """``n`` failed commands in batches (bulk INSERTs of ``BATCH`` rows)."""
    now = timezone.now()
    for offset in range(0, n, BATCH):
        rows = []
        for i in range(start + offset, start + min(offset + BATCH, n)):
            outlook, reason, error_class, error = MIX[i % len(MIX)]
            connector = connectors[i % len(connectors)]
            rows.append(
                Command(
                    tenant_id=connector.tenant_id,
                    connector=connector,
                    payload={"order": f"A-{i}", "ref": f"R{i:06d}", "action": "ship"},
                    state=State.FAILED,
                    state_changed_at=now,
                    last_outlook=outlook,
                    skip_reason=reason,
                    attempts=3,
                    last_error_class=error_class,
                    last_error=error,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
        Command.objects.bulk_create(rows, batch_size=1000)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE commands_command")


def render(client: Client, url: str) -> float:
    started = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise SystemExit(f"the failed list answered {response.status_code}")
    return elapsed


def best_render(client: Client, url: str, rounds: int, per_round: int) -> tuple[float, list[float]]:
    """The best render (seconds) over ``rounds`` of ``per_round`` renders, and each round's best."""
    render(client, url)  # warm: templates compiled, connection open, caches filled
    bests = [min(render(client, url) for _ in range(per_round)) for _ in range(rounds)]
    return min(bests), bests


def queries_of(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        render(client, url)
    return len(captured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test, not a measurement)")
    args = parser.parse_args()
    small, large = (100, 2000) if args.quick else (1000, 100_000)
    rounds, per_round = (2, 3) if args.quick else (5, 5)

    setup_test_environment()  # the test client's host is allowed, e-mail stays in memory
    db = settings.DATABASES["default"]
    name = f"bench_admin_{os.getpid()}"
    if db["ENGINE"].endswith("sqlite3"):
        name = str(Path(db["NAME"]).with_name(f"{name}.sqlite3"))
    db.setdefault("TEST", {})["NAME"] = name
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        tenants = [Tenant.objects.create(slug=f"t{i}", name=f"Tenant {i}") for i in range(3)]
        connectors = [
            Connector.objects.create(tenant=tenant, name=f"c{j}", kind="http", url="http://127.0.0.1:9/")
            for tenant in tenants
            for j in range(3)
        ]
        user = User.objects.create_superuser("bench", "bench@example.com", "bench")
        client = Client()
        client.force_login(user)
        url = reverse("admin:commands_failedcommand_changelist")

        after_fix = url + "?reason=after-fix"
        connector_list = reverse("admin:commands_connector_changelist")
        # One match at either size (a fixed-width reference), so both pages draw the same rows.
        payload_search = reverse("admin:commands_command_changelist") + "?q=R000517"
        fill(connectors, 0, small)
        small_before, small_rounds = best_render(client, url, rounds, per_round)
        fix_small_before, _ = best_render(client, after_fix, rounds, per_round)
        connectors_small_before, _ = best_render(client, connector_list, rounds, per_round)
        search_small_before, _ = best_render(client, payload_search, rounds, per_round)
        queries_small = queries_of(client, url)

        started = time.perf_counter()
        fill(connectors, small, large - small)
        fill_s = time.perf_counter() - started
        large_best, large_rounds = best_render(client, url, rounds, per_round)
        fix_large, _ = best_render(client, after_fix, rounds, per_round)
        connectors_large, _ = best_render(client, connector_list, rounds, per_round)
        search_large, _ = best_render(client, payload_search, rounds, per_round)
        queries_large = queries_of(client, url)

        first_large = Command.objects.order_by("pk").values_list("pk", flat=True)[small]
        Command.objects.filter(pk__gte=first_large).delete()
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE commands_command")
        small_after, small_rounds_after = best_render(client, url, rounds, per_round)
        fix_small_after, _ = best_render(client, after_fix, rounds, per_round)
        connectors_small_after, _ = best_render(client, connector_list, rounds, per_round)
        search_small_after, _ = best_render(client, payload_search, rounds, per_round)
    finally:
        connection.close()
        teardown_databases(old_config, verbosity=0)

    small_best = min(small_before, small_after)
    ratio = large_best / small_best
    fix_small = min(fix_small_before, fix_small_after)
    connectors_small = min(connectors_small_before, connectors_small_after)
    search_small = min(search_small_before, search_small_after)
    figures = {
        "failed_list_100k_vs_1k": round(ratio, 3),
        "after_fix_100k_vs_1k": round(fix_large / fix_small, 3),
        "connector_list_100k_vs_1k": round(connectors_large / connectors_small, 3),
        "payload_search_100k_vs_1k": round(search_large / search_small, 3),
        "ms_connector_list_small": round(connectors_small * 1000, 2),
        "ms_connector_list_large": round(connectors_large * 1000, 2),
        "ms_payload_search_small": round(search_small * 1000, 2),
        "ms_payload_search_large": round(search_large * 1000, 2),
        "ms_small": round(small_best * 1000, 2),
        "ms_large": round(large_best * 1000, 2),
        "ms_after_fix_small": round(fix_small * 1000, 2),
        "ms_after_fix_large": round(fix_large * 1000, 2),
        "queries_small": queries_small,
        "queries_large": queries_large,
        "small": small,
        "large": large,
        "fill_large_s": round(fill_s, 1),
        "database": connection.vendor,
        "rounds": rounds,
        "renders_per_round": per_round,
        "quick": args.quick,
    }
    print(f"{'measure':<44}{'value':>12}")
    print(f"{f'failed list, {small:,} commands, best ms':<44}{small_best * 1000:>12.2f}")
    print(
        f"{'  rounds before the large fill, ms':<44}{' '.join(f'{b * 1000:.1f}' for b in small_rounds):>12}"
    )
    print(
        f"{'  rounds after deleting it again, ms':<44}{' '.join(f'{b * 1000:.1f}' for b in small_rounds_after):>12}"
    )
    print(f"{f'failed list, {large:,} commands, best ms':<44}{large_best * 1000:>12.2f}")
    print(f"{'  rounds, ms':<44}{' '.join(f'{b * 1000:.1f}' for b in large_rounds):>12}")
    print(f"{'queries per render (small / large)':<44}{f'{queries_small} / {queries_large}':>12}")
    print(f"{f'filling {large - small:,} rows, s':<44}{fill_s:>12.1f}")
    print(f"{'large / small (target <= 1.5)':<44}{ratio:>12.3f}")
    print(
        f"{'after-fix filter: small / large, best ms':<44}{f'{fix_small * 1000:.1f} / {fix_large * 1000:.1f}':>12}"
    )
    print(f"{'after-fix filter: large / small':<44}{fix_large / fix_small:>12.3f}")
    print(
        f"{'connector list: small / large, best ms':<44}"
        f"{f'{connectors_small * 1000:.1f} / {connectors_large * 1000:.1f}':>12}"
    )
    print(f"{'connector list: large / small (<= 1.5)':<44}{connectors_large / connectors_small:>12.3f}")
    print(
        f"{'payload search: small / large, best ms':<44}"
        f"{f'{search_small * 1000:.1f} / {search_large * 1000:.1f}':>12}"
    )
    print(f"{'payload search: large / small (<= 1.5)':<44}{search_large / search_small:>12.3f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
