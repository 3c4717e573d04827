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

* ``connector_health_1k_vs_10`` — the connector list (its health columns: sends and success rate
  over the hour and the day, p50/p95, failures in a row, failed commands by reason) with 1,000
  connectors and 1,000,000 attempts of the last day, ÷ with 10 connectors and 10,000 attempts
  (the same 1,000 a connector). Target ≤ 1.5: the page reads the health summary
  (``commands.health``), never the attempts. Both pages draw the same 10 rows (the admin's page
  size is set to 10 for it), so the ratio prices the data behind a row, not 90 more rows drawn;
  ``ms_health_page_100_rows`` is the default 100-row page at 1,000 connectors, for reference. The
  attempts are made by one INSERT … SELECT (``generate_series`` on PostgreSQL, a recursive CTE on
  SQLite), and the summary is built from them by ``commands.health.backfill`` (``manage.py
  health_backfill``, the documented way for an install that has attempts and no summary), whose
  time is ``health_backfill_s`` (run as that command, in a process of its own). With ``--quick``: 50 connectors and 10,000 attempts.

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
import subprocess
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import urlsplit

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


# --- connector health -------------------------------------------------------------------------

HEALTH_COMMANDS = 100  # per connector; each with ATTEMPTS_EACH attempts, spread over the last day
HEALTH_SMALL = 10


def fill_health(tenant: Tenant, first: int, count: int, attempts_each: int) -> list[int]:
    """``count`` connectors, each with ``HEALTH_COMMANDS`` succeeded commands of ``attempts_each``
    attempts finished at random in the last day (95% ok), in three INSERT … SELECT statements."""
    connectors = Connector.objects.bulk_create(
        Connector(tenant=tenant, name=f"h{i:04}", kind="http", url="http://127.0.0.1:9/")
        for i in range(first, first + count)
    )
    ids = [c.pk for c in connectors]
    listed = ", ".join(str(pk) for pk in ids)
    now = timezone.now()
    pg = connection.vendor == "postgresql"
    commands = (
        "INSERT INTO commands_command (tenant_id, connector_id, idempotency_key, payload, state, "
        "state_changed_at, last_outlook, attempts, skip_reason, last_error_class, last_error, created_at) "
        f"SELECT c.tenant_id, c.id, '', '{{}}', 'succeeded', %s, '', {attempts_each}, '', '', '', %s "
        f"FROM commands_connector c, {series(HEALTH_COMMANDS, pg)} WHERE c.id IN ({listed})"
    )
    # Sends of 10 ms to about 1 s, finished in the last 24 hours; one in 20 failed.
    if pg:
        finished = "%s - random() * interval '24 hours'"
        started = "f.finished - (0.01 + random()) * interval '1 second'"
        failed = "random() < 0.05"
    else:
        finished = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '-' || ((abs(random()) %% 86400000) / 1000.0) || ' seconds')"
        started = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', f.finished, '-' || ((10 + abs(random()) %% 1000) / 1000.0) || ' seconds')"
        failed = "abs(random()) %% 20 = 0"
    attempts = (
        "INSERT INTO commands_attempt (command_id, number, started_at, finished_at, ok, outlook, status_code, "
        "error_class, error_message, response_excerpt, manual) "
        f"SELECT f.id, f.n, {started}, f.finished, NOT f.failed, CASE WHEN f.failed THEN 'again' ELSE '' END, "
        "CASE WHEN f.failed THEN 503 ELSE 200 END, CASE WHEN f.failed THEN 'HTTPStatus' ELSE '' END, "
        "CASE WHEN f.failed THEN 'HTTP 503 from the receiver' ELSE '' END, '', false "
        f"FROM (SELECT cmd.id, n.x AS n, {finished} AS finished, {failed} AS failed "
        f"FROM commands_command cmd, {series(attempts_each, pg)} WHERE cmd.connector_id IN ({listed})) f"
    )
    stamp = now if pg else connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.execute(commands, [stamp, stamp])
        cursor.execute(attempts, [stamp])
    return ids


def series(n: int, pg: bool) -> str:
    """1 … n as a table ``n(x)``."""
    if pg:
        return f"generate_series(1, {n}) AS n(x)"
    return f"(WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < {n}) SELECT x FROM s) AS n"


def backfill_command() -> int:
    """``manage.py health_backfill`` against the bench's database, in a process of its own (as an
    operator runs it, and so that a million rows read in Python leave this process as it was);
    returns the sends it summarised."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        url = urlsplit(os.environ["DATABASE_URL"])._replace(path="/" + db["NAME"]).geturl()
    else:
        url = "sqlite:///" + str(db["NAME"])  # absolute: sqlite:////path
    done = subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), "health_backfill"],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split("connector health: ")[1].split()[0])


def analyze() -> None:
    """Fresh statistics, and on PostgreSQL nothing left for autovacuum to do: a million new rows
    would otherwise have it vacuum the attempts table while the large size renders."""
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")


def drop_connectors(ids: list[int]) -> None:
    listed = ", ".join(str(pk) for pk in ids)
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM commands_attempt WHERE command_id IN "
            f"(SELECT id FROM commands_command WHERE connector_id IN ({listed}))"
        )
        cursor.execute(f"DELETE FROM commands_command WHERE connector_id IN ({listed})")
    Connector.objects.filter(pk__in=ids).delete()  # with their health rows
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")


def connector_health(client: Client, rounds: int, per_round: int, quick: bool) -> dict:
    """The figures of ``connector_health_1k_vs_10`` (see the module docstring)."""
    from commands.staff.admin_connectors import ConnectorAdmin

    large = 50 if quick else 1000
    attempts_each = 2 if quick else 10  # per command: 200 or 1,000 a connector
    Command.objects.all().delete()  # the failed-list figures' rows: this list starts empty
    Connector.objects.all().delete()
    tenants = [Tenant.objects.create(slug=f"h{i}", name=f"Health {i}") for i in range(10)]
    url = reverse("admin:commands_connector_changelist")
    started = time.perf_counter()
    small_ids = fill_health(tenants[0], 0, HEALTH_SMALL, attempts_each)
    fill_small_s = time.perf_counter() - started
    backfill_command()
    analyze()
    ConnectorAdmin.list_per_page = HEALTH_SMALL  # the same rows drawn at both sizes
    try:
        small_before, _ = best_render(client, url, rounds, per_round)
        queries_small = queries_of(client, url)
        started = time.perf_counter()
        large_ids: list[int] = []
        per_tenant = (large - HEALTH_SMALL) // len(tenants)
        for i, tenant in enumerate(tenants):
            count = (
                per_tenant if i < len(tenants) - 1 else large - HEALTH_SMALL - per_tenant * (len(tenants) - 1)
            )
            large_ids += fill_health(tenant, HEALTH_SMALL + i * per_tenant, count, attempts_each)
        fill_s = time.perf_counter() - started
        started = time.perf_counter()
        sends = backfill_command()
        backfill_s = time.perf_counter() - started
        analyze()
        large_best, _ = best_render(client, url, rounds, per_round)
        queries_large = queries_of(client, url)
        ConnectorAdmin.list_per_page = 100
        page_100, _ = best_render(client, url, rounds, per_round)
        ConnectorAdmin.list_per_page = HEALTH_SMALL
        drop_connectors(large_ids)
        small_after, _ = best_render(client, url, rounds, per_round)
    finally:
        ConnectorAdmin.list_per_page = 100
    small_best = min(small_before, small_after)
    return {
        "connector_health_1k_vs_10": round(large_best / small_best, 3),
        "ms_health_small": round(small_best * 1000, 2),
        "ms_health_large": round(large_best * 1000, 2),
        "ms_health_page_100_rows": round(page_100 * 1000, 2),
        "health_queries_small": queries_small,
        "health_queries_large": queries_large,
        "health_connectors": large,
        "health_attempts": sends,
        "health_fill_s": round(fill_s + fill_small_s, 1),
        "health_backfill_s": round(backfill_s, 1),
        "health_small_ids": len(small_ids),
    }


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
    parser.add_argument("--health-only", action="store_true", help="only connector_health_1k_vs_10")
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
        user = User.objects.create_superuser("bench", "bench@example.com", "bench")
        client = Client()
        client.force_login(user)
        if not args.health_only:
            tenants = [Tenant.objects.create(slug=f"t{i}", name=f"Tenant {i}") for i in range(3)]
            connectors = [
                Connector.objects.create(tenant=tenant, name=f"c{j}", kind="http", url="http://127.0.0.1:9/")
                for tenant in tenants
                for j in range(3)
            ]
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
        health_figures = connector_health(client, rounds, per_round, args.quick)
    finally:
        connection.close()
        teardown_databases(old_config, verbosity=0)

    health_lines = [
        (f"health list, {HEALTH_SMALL} connectors, best ms", f"{health_figures['ms_health_small']:.2f}"),
        (f"health list, {health_figures['health_connectors']:,} connectors, best ms",
         f"{health_figures['ms_health_large']:.2f}"),
        ("  the same, 100 rows a page, ms", f"{health_figures['ms_health_page_100_rows']:.2f}"),
        ("  attempts summarised / backfill s",
         f"{health_figures['health_attempts']:,} / {health_figures['health_backfill_s']}"),
        ("health queries (small / large)",
         f"{health_figures['health_queries_small']} / {health_figures['health_queries_large']}"),
        ("health: large / small (target <= 1.5)", f"{health_figures['connector_health_1k_vs_10']:.3f}"),
    ]  # fmt: skip
    if args.health_only:
        for label, value in health_lines:
            print(f"{label:<44}{value:>16}")
        print(json.dumps({**health_figures, "database": connection.vendor, "quick": args.quick}))
        return
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
        **health_figures,
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
    for label, value in health_lines:
        print(f"{label:<44}{value:>12}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
