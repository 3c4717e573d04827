"""Connector health: each figure exact from a known set of sends written by the dispatch recorder
(time given explicitly), the summary's upsert in both its SQL and stock forms, the backfill that
rebuilds it, concurrent recorders, retention, and where it is shown — admin list and page,
dashboard, API, Prometheus — at a query count that does not grow with the connectors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ankusa_site.core.stock import stock
from commands import health, health_figures, retention
from commands.dispatch import adapters
from commands.dispatch.outcomes import record_outcomes
from commands.dispatch.sends import Sent
from commands.models import Command
from commands.models.health import HOUR, MINUTE, ConnectorHealth, HealthBucket
from commands.retry import Outlook
from commands.staff.explain import waiting_for
from commands.states import State
from tests.commands.staff import make_failed

NOW = datetime(2026, 12, 1, 12, 30, 30, tzinfo=UTC)
LIST = reverse("admin:commands_connector_changelist")


def sent(connector, finished: datetime, seconds: float, ok: bool, error: str = "HTTP 503") -> Sent:
    """A finished send of a new dispatching command of ``connector``."""
    command = Command.objects.create(
        tenant=connector.tenant, connector=connector, state=State.DISPATCHING, attempts=1
    )
    outcome = (
        adapters.Outcome(ok=True, status=200)
        if ok
        else adapters.Outcome(
            ok=False, outlook=Outlook.AGAIN, status=503, detail=error, error_class="HTTPStatus"
        )
    )
    return Sent(command, 1, finished - timedelta(seconds=seconds), finished, outcome)


def record(*sends: Sent) -> None:
    record_outcomes(list(sends), NOW)


def known_sends(connector) -> None:
    """Four batches, as the recorder writes them: one outside the day, two in the day only, four in
    the last hour (the last of them a failure), one a minute outside the hour."""
    record(sent(connector, NOW - timedelta(hours=25), 0.04, False))
    record(
        sent(connector, NOW - timedelta(hours=2), 0.2, True),
        sent(connector, NOW - timedelta(hours=2), 0.2, True),
    )
    # 11:30:59 is in the minute before the hour's first one (11:31): the day's, not the hour's.
    record(sent(connector, datetime(2026, 12, 1, 11, 30, 59, tzinfo=UTC), 0.004, True))
    record(
        *(sent(connector, datetime(2026, 12, 1, 11, 31, tzinfo=UTC), 0.04, True) for _ in range(2)),
        sent(connector, NOW - timedelta(minutes=10), 0.04, True),
        sent(connector, NOW - timedelta(minutes=5), 2.0, False, "HTTP 503: down for maintenance"),
    )


def test_each_figure_is_exact_for_a_known_set_of_sends(make_connector):
    crm = make_connector("crm")
    known_sends(crm)
    figures = health_figures.figures([crm.pk], NOW)[crm.pk]
    # The last hour: 11:31:00 on (the current minute and the 59 before it): 3 ok of 4.
    assert (figures.hour.sends, figures.hour.ok, figures.hour.rate) == (4, 3, 0.75)
    # Send times 0.04, 0.04, 0.04, 2.0: the median's bin ends at 50 ms, the 95th's at 2.5 s.
    assert (figures.hour.quantile(0.5), figures.hour.quantile(0.95)) == (0.05, 2.5)
    # The last day: 11:00 yesterday's hour is out (25 h ago); 7 sends, 6 ok.
    assert (figures.day.sends, figures.day.ok) == (7, 6)
    assert (figures.day.quantile(0.5), figures.day.quantile(0.95)) == (0.05, 2.5)
    assert figures.consecutive_failures == 1
    assert (figures.last_error_class, figures.last_error) == ("HTTPStatus", "HTTP 503: down for maintenance")
    assert figures.last_error_at == NOW - timedelta(minutes=5)
    assert figures.last_ok_at == NOW - timedelta(minutes=10)
    data = figures.as_dict()
    assert data["last_hour"] == {"sends": 4, "ok": 3, "success_rate": 0.75, "p50_s": 0.05, "p95_s": 2.5,
                                 "p50": "≤ 50 ms", "p95": "≤ 2.5 s"}  # fmt: skip

    # 23 hours on, the last hour is empty and the day starts at 12:00 today: the last two sends.
    later = health_figures.figures([crm.pk], NOW + timedelta(hours=23))[crm.pk]
    assert (later.hour.sends, later.day.sends, later.day.ok) == (0, 2, 1)
    assert later.hour.quantile(0.5) is None and later.hour.rate is None


def test_failures_in_a_row_grow_across_batches_and_a_success_ends_them(make_connector):
    crm = make_connector("crm")
    record(sent(crm, NOW, 0.1, False), sent(crm, NOW, 0.1, False))
    record(sent(crm, NOW, 0.1, False, "HTTP 502"))
    row = ConnectorHealth.objects.get(connector=crm)
    assert (row.consecutive_failures, row.last_error) == (3, "HTTP 502")
    record(sent(crm, NOW, 0.1, False), sent(crm, NOW, 0.1, True), sent(crm, NOW, 0.1, False, "HTTP 500"))
    row.refresh_from_db()
    assert (row.consecutive_failures, row.last_error) == (1, "HTTP 500")
    record(sent(crm, NOW, 0.1, True))
    row.refresh_from_db()
    assert (row.consecutive_failures, row.last_error, row.last_ok_at) == (0, "HTTP 500", NOW)


def test_a_send_slower_than_the_last_bound_reads_more_than_it(make_connector):
    crm = make_connector("crm")
    record(sent(crm, NOW, 400, True))
    window = health_figures.figures([crm.pk], NOW)[crm.pk].hour
    assert window.as_dict()["p95_s"] is None and window.as_dict()["p95"] == "> 300 s"


def test_a_batch_adds_to_the_summary_in_one_statement_on_postgresql(make_connector):
    if connection.vendor != "postgresql" or stock("sql"):
        pytest.skip("SQLite and the stock ORM write the buckets and the runs apart")
    crm, erp = make_connector("crm"), make_connector("erp")
    sends = [sent(crm, NOW, 0.1, True), sent(crm, NOW, 0.1, False), sent(erp, NOW, 0.1, True)]
    with CaptureQueriesContext(connection) as captured:
        health.record(sends)
    assert len(captured) == 1
    assert HealthBucket.objects.filter(span=MINUTE).count() == 2
    assert ConnectorHealth.objects.get(connector=crm).consecutive_failures == 1
    # More buckets than SQLite's statements take, in the same statement text (kept prepared).
    minutes = health.UPSERT_ROWS + 10
    many = [sent(erp, NOW - timedelta(minutes=n), 0.1, True) for n in range(minutes)]
    with CaptureQueriesContext(connection) as again:
        health.record(many)
    assert len(again) == 1
    if not stock("prepared"):  # Django's cursor logs the statement with its values in it
        assert again[0]["sql"].split(" -- ")[0] == captured[0]["sql"].split(" -- ")[0]
    assert HealthBucket.objects.filter(connector=erp, span=MINUTE).count() == minutes
    hours = HealthBucket.objects.filter(connector=erp, span=HOUR)
    assert sum(hours.values_list("sends", flat=True)) == minutes + 1


def test_the_stock_upsert_writes_what_the_sql_one_writes(make_connector, settings):
    fast, slow = make_connector("fast"), make_connector("slow")
    known_sends(fast)
    settings.ANKUSA_STOCK_DJANGO = frozenset({"sql"})
    known_sends(slow)
    found = health_figures.figures([fast.pk, slow.pk], NOW)
    assert found[fast.pk].as_dict() | {"connector": 0} == found[slow.pk].as_dict() | {"connector": 0}


def test_the_backfill_builds_from_the_attempts_what_the_recorder_built(make_connector):
    crm, quiet = make_connector("crm"), make_connector("quiet")
    known_sends(crm)
    record(sent(quiet, NOW - timedelta(minutes=1), 0.3, True))
    recorded = health_figures.figures([crm.pk, quiet.pk], NOW)
    HealthBucket.objects.all().delete()
    ConnectorHealth.objects.all().delete()
    assert health_figures.figures([crm.pk], NOW)[crm.pk].day.sends == 0  # an install with attempts only
    assert health.backfill(NOW) == 8  # the day's sends (not the one 25 h ago)
    rebuilt = health_figures.figures([crm.pk, quiet.pk], NOW)
    assert rebuilt[quiet.pk] == recorded[quiet.pk]
    assert rebuilt[crm.pk] == recorded[crm.pk]  # consecutive failures included: within the day
    call_command("health_backfill", stdout=open("/dev/null", "w"))  # noqa: SIM115 - the command's door


def test_waiting_counts_by_reason_match_the_failed_lists_filters_and_stop_at_the_cap(
    make_connector, make_command, admin_user
):
    crm = make_connector("crm")
    make_failed(crm, outlook="after-fix", reason="")
    make_failed(crm, outlook="after-fix", reason="backing-off")
    make_failed(crm, outlook="again", reason="backing-off")
    make_failed(crm, outlook="never", reason="never")
    make_failed(crm, outlook="again", reason="attempts-spent", resend_by=admin_user)
    make_failed(crm, outlook="", reason="")
    make_command(crm, state=State.APPROVED)
    make_command(crm, state=State.QUEUED)
    make_command(crm, state=State.SUCCEEDED)
    waiting = health_figures.figures([crm.pk], NOW)[crm.pk].waiting
    assert waiting == {"after-fix": 2, "backing-off": 1, "never": 1, "resend-pending": 1, "none": 1,
                       "attempts-spent": 0, "not-idempotent": 0, "outlook-unknown": 0,
                       "not-dispatchable": 0, "to-go": 2}  # fmt: skip
    failed = Command.objects.filter(connector=crm, state=State.FAILED)
    for key in health_figures.WAIT_KEYS:
        assert waiting[key] == failed.filter(waiting_for(key)).count(), key
    Command.objects.bulk_create(
        Command(
            tenant=crm.tenant, connector=crm, state=State.FAILED, skip_reason="never", last_outlook="never"
        )
        for _ in range(health_figures.CAP + 5)
    )
    assert health_figures.figures([crm.pk], NOW)[crm.pk].waiting["never"] == health_figures.CAP + 1


def recorders_at_once(count: int, record) -> list[Exception]:
    """Run ``record(n)`` for n in ``range(count)`` in as many threads, started together; the
    errors they raised."""
    start, errors = threading.Barrier(count), []

    def recorder(n: int):
        start.wait()
        try:
            record(n)
        except Exception as error:  # noqa: BLE001 - returned, for the test to assert on
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=recorder, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@pytest.mark.django_db(transaction=True)
def test_concurrent_recorders_both_count(make_connector):
    crm = make_connector("crm")

    def record(n: int):
        for _ in range(5):
            record_outcomes([sent(crm, NOW, 0.02, True) for _ in range(10)], NOW)

    assert recorders_at_once(4, record) == []
    figures = health_figures.figures([crm.pk], NOW)[crm.pk]
    assert (figures.hour.sends, figures.day.sends, figures.hour.ok) == (200, 200, 200)
    assert HealthBucket.objects.filter(connector=crm).count() == 2  # one minute, one hour


@pytest.mark.django_db(transaction=True)
def test_recorders_sharing_connectors_in_any_order_lock_them_in_one_order(make_connector):
    crm, erp = make_connector("crm"), make_connector("erp")
    # Rows go out in key order whatever order the batch holds them in, so two recorders whose
    # batches name the same connectors take their rows' locks in the same order: no deadlock.
    _, buckets, runs = health._summary(
        [(one.command.connector_id, one.started, one.finished, True, "", "") for one in
         (sent(erp, NOW, 0.1, True), sent(crm, NOW - timedelta(hours=2), 0.1, True))]
    )  # fmt: skip
    assert [row[:2] for row in buckets] == sorted(row[:2] for row in buckets)
    assert [row[0] for row in runs] == [crm.pk, erp.pk]

    def record(n: int):
        for _ in range(10):
            pair = [sent(crm, NOW, 0.02, True), sent(erp, NOW, 0.02, True)]
            record_outcomes(pair if n % 2 else pair[::-1], NOW)

    assert recorders_at_once(4, record) == []  # a deadlock the database broke would be here
    figures = health_figures.figures([crm.pk, erp.pk], NOW)
    assert [figures[pk].hour.sends for pk in (crm.pk, erp.pk)] == [40, 40]


CHILD = """
import django, sys
from datetime import datetime, timedelta
django.setup()
from django.db import transaction
from commands import health
finished = datetime.fromisoformat(sys.argv[2])
for _ in range(5):
    with transaction.atomic():  # as the recorder: one transaction a batch
        health.record_rows([(int(sys.argv[1]), finished - timedelta(seconds=0.02), finished, True, "", "")] * 10)
"""


@pytest.mark.django_db(transaction=True)
def test_concurrent_recorder_processes_both_count(make_connector):
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        url = urlsplit(os.environ["DATABASE_URL"])._replace(path="/" + db["NAME"]).geturl()
    elif "memory" in str(db["NAME"]):
        pytest.skip("an in-memory SQLite database is one process's")
    else:
        url = f"sqlite:///{db['NAME']}"
    crm = make_connector("crm")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(crm.pk), NOW.isoformat()],
            env={**os.environ, "DATABASE_URL": url},
            cwd=settings.BASE_DIR,
        )
        for _ in range(4)
    ]
    assert [child.wait(timeout=120) for child in children] == [0, 0, 0, 0]
    figures = health_figures.figures([crm.pk], NOW)[crm.pk]
    assert (figures.hour.sends, figures.day.sends, figures.hour.ok) == (200, 200, 200)


def test_prune_removes_the_buckets_no_window_reads(make_connector):
    crm = make_connector("crm")
    record(sent(crm, NOW - timedelta(hours=3), 0.1, True), sent(crm, NOW - timedelta(days=3), 0.1, True))
    record(sent(crm, NOW, 0.1, True))
    report = retention.prune(now=NOW, pause_s=0, only=["health"])
    assert report.removed == {"commands.HealthBucket": 3}  # 2 old minutes, 1 old hour
    kept = set(HealthBucket.objects.values_list("span", "start"))
    assert kept == {(MINUTE, health.floor(NOW, MINUTE)), (HOUR, health.floor(NOW, HOUR)),
                    (HOUR, health.floor(NOW - timedelta(hours=3), HOUR))}  # fmt: skip


# --- where it is shown ---------------------------------------------------------------------------


def recent_sends(connector, now: datetime) -> None:
    record(
        sent(connector, now, 0.04, True), sent(connector, now, 0.04, True), sent(connector, now, 2.0, True)
    )
    record(sent(connector, now, 0.04, False, "HTTP 503: down"))
    make_failed(connector, outlook="never", reason="never")


def test_the_admin_list_and_page_show_the_figures(admin_client, make_connector):
    from django.utils import timezone

    crm = make_connector("crm")
    make_connector("quiet")
    recent_sends(crm, timezone.now())
    html = admin_client.get(LIST).content.decode()
    assert "75% of 4" in html  # the last hour and the last day
    assert "p50 ≤ 50 ms<br>p95 ≤ 2.5 s" in html
    assert f"?connector__id__exact={crm.pk}&amp;reason=never" in html
    page = admin_client.get(reverse("admin:commands_connector_change", args=[crm.pk])).content.decode()
    assert '<table class="ankusa-health">' in page
    assert "<th>failures in a row</th><td>1</td>" in page
    assert "HTTP 503: down" in page


def test_the_dashboard_shows_the_connectors_failing_longest(admin_client, make_connector):
    from django.utils import timezone

    now = timezone.now()
    ok, bad, worse = make_connector("ok"), make_connector("bad"), make_connector("worse")
    record(sent(ok, now, 0.1, True))
    record(sent(bad, now, 0.1, False))
    record(sent(worse, now, 0.1, False), sent(worse, now, 0.1, False))
    html = admin_client.get(reverse("admin:index")).content.decode()
    table = html[html.index('id="ankusa-worst-connectors"') :]
    table = table[: table.index("</table>")]
    assert table.index("acme/worse") < table.index("acme/bad")
    assert "acme/ok" not in table


def test_the_list_costs_the_same_queries_for_3_and_30_connectors(admin_client, make_connector):
    from django.utils import timezone

    def fill(start, n):
        for i in range(start, start + n):
            recent_sends(make_connector(f"c{i:02}"), timezone.now())

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(LIST).status_code == 200
        return len(captured)

    fill(0, 3)
    few = queries()
    fill(3, 27)
    assert queries() == few


def test_the_api_answers_one_connectors_health_and_a_page_of_them(world, call):
    from django.utils import timezone

    recent_sends(world.a.connector, timezone.now())
    status, data = call("viewer", "GET", f"/api/v1/connectors/{world.a.connector.pk}/health/")
    assert status == 200
    assert (data["tenant"], data["name"], data["consecutive_failures"]) == ("acme", "billing", 1)
    assert data["last_hour"]["sends"] == 4 and data["last_hour"]["success_rate"] == 0.75
    assert data["last_error"]["detail"] == "HTTP 503: down"
    # The world's failed command and this test's, and the failed send (again, not idempotent).
    assert data["waiting"] == {"never": 2, "not-idempotent": 1}
    status, page = call("admin", "GET", "/api/v1/connectors/health/?tenant=acme")
    assert status == 200
    assert [row["name"] for row in page["results"]] == ["billing", "spare"]
    status, mine = call("tenant_b", "GET", "/api/v1/connectors/health/")
    assert {row["tenant"] for row in mine["results"]} == {"globex"}
    assert call("tenant_b", "GET", f"/api/v1/connectors/{world.a.connector.pk}/health/")[0] == 404
    status, refused = call("admin", "GET", "/api/v1/connectors/health/?tenat=acme")
    assert status == 400 and "tenat" in refused["fields"]


def test_prometheus_labels_a_bounded_set_of_connectors(client, make_connector, settings):
    from django.utils import timezone

    now = timezone.now()
    ok, bad = make_connector("ok"), make_connector("bad")
    record(sent(ok, now, 0.04, True))
    record(sent(bad, now, 0.04, False), sent(bad, now, 0.04, False))
    text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert 'ankusa_connector_consecutive_failures{connector="bad",tenant="acme"} 2.0' in text
    assert 'ankusa_connector_sends{connector="ok",tenant="acme",window="1h"} 1.0' in text
    assert 'ankusa_connector_success_ratio{connector="bad",tenant="acme",window="24h"} 0.0' in text
    assert (
        'ankusa_connector_send_seconds{connector="ok",quantile="0.5",tenant="acme",window="1h"} 0.05' in text
    )
    assert "ankusa_connectors_failing 1.0" in text
    settings.ANKUSA_METRICS_CONNECTORS = 1
    text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert 'connector="bad"' in text and 'connector="ok"' not in text
