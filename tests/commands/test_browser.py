"""The staff path through a real browser (Playwright driving Debian's Chromium) against a real gunicorn,
on a 1280 px laptop screen: log in → the dashboard warns that no dispatch process ran lately → every
list fits the screen, the failed list explains each reason once → the connector list shows URL,
rate, counts and last error, its failing count leads to those commands → filter after-fix → open
the command (its attempts, linked, with the answer) → its connector → fix the credential → the
command is due now → from another command's own page, resend it with a typed override reason
through the confirmation and its dry run → the audit row is there.

Screenshots of the dashboard, the failed list, a command page, the connector list and a resend
confirmation go to ``artifacts/screenshots/`` (CI keeps the folder). Without ``/usr/bin/chromium`` the test is skipped locally and fails under
``ANKUSA_REQUIRE_SERVICES=1``: CI installs Chromium first (``.ci/run``).

The server is a separate process, so the browser never shares this test's thread; the ORM calls
made here between browser steps are allowed by ``DJANGO_ALLOW_ASYNC_UNSAFE`` because Playwright's
sync API keeps an event loop on this thread (nothing else runs on it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connections
from django.utils import timezone

from commands import health
from commands.dispatch import heartbeat
from commands.models import Attempt, AuditEntry, Command, Connector, DispatcherHeartbeat
from commands.states import State
from limits.models import Tenant
from tests.services import require_service

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(settings.BASE_DIR) / "artifacts" / "screenshots"
PASSWORD = "a-long-browser-password-1"


@pytest.fixture
def browser(monkeypatch):
    # Set before the browser starts and undone after it stops (and after the database flush).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not os.path.exists(CHROMIUM):
        require_service("Chromium", f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - playwright is pinned in requirements-dev.txt
        require_service("Playwright", str(exc))
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield launched
        launched.close()


@pytest.fixture
def world(transactional_db):
    """An admin-group user, a connector missing its credential with a command waiting for that fix,
    and a non-idempotent connector with a command that needs an override to be resent."""
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    broken = Connector.objects.create(
        tenant=tenant,
        name="billing",
        kind="http",
        url="http://127.0.0.1:9/",
        secret_header="Authorization",
        idempotent=True,
    )
    risky = Connector.objects.create(
        tenant=tenant, name="ledger", kind="http", url="http://127.0.0.1:9/", idempotent=False
    )
    now = timezone.now()
    waiting = Command.objects.create(
        tenant=tenant,
        connector=broken,
        payload={"invoice": "INV-1"},
        state=State.FAILED,
        last_outlook="after-fix",
        skip_reason="backing-off",
        attempts=1,
        next_attempt_at=now + timezone.timedelta(minutes=10),
        last_error_class="Configuration",
        last_error="missing credential for the Authorization header",
    )
    unsure = Command.objects.create(
        tenant=tenant,
        connector=risky,
        payload={"entry": "E-7"},
        state=State.FAILED,
        last_outlook="again",
        skip_reason="not-idempotent",
        attempts=1,
        last_error_class="HTTPStatus",
        last_error="HTTP 503 from the receiver",
    )
    # A day of history for the chart: sends that went out, and the failures above.
    for hour in range(0, 24, 2):
        done = Command.objects.create(tenant=tenant, connector=risky, state=State.SUCCEEDED, attempts=1)
        at = now - timezone.timedelta(hours=hour, minutes=5)
        Attempt.objects.create(
            command=done, number=1, started_at=at, finished_at=at, ok=True, status_code=200
        )
    for command, outlook, hours, status in ((waiting, "after-fix", 3, 401), (unsure, "again", 1, 503)):
        at = now - timezone.timedelta(hours=hours)
        Attempt.objects.create(
            command=command,
            number=1,
            started_at=at,
            finished_at=at,
            ok=False,
            outlook=outlook,
            status_code=status,
            response_excerpt=f'{{"error": "HTTP {status}", "detail": "the receiver said no"}}',
        )
    health.backfill(now)  # attempts written here, not by the recorder: the summary is built from them
    # A dispatch loop that ran its last round ten minutes ago: paused, the dashboard must say so.
    heartbeat.beat("loop", now=now - timezone.timedelta(minutes=10))
    DispatcherHeartbeat.objects.update(name="ops-box:4242")
    user = User.objects.create_user("ops-admin", "ops@example.com", PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get(name="admin"))
    return {"waiting": waiting, "unsure": unsure, "broken": broken, "user": user}


def test_a_person_fixes_a_connector_and_resends_with_an_override_in_a_real_browser(
    world, start_node, browser
):
    try:
        walk_through(world, start_node, browser)
    finally:
        # Under Playwright's sync API the test body runs in a context of its own, and Django keeps
        # a database connection per context: close it here, or PostgreSQL refuses to drop the
        # test database at the end of the session.
        connections.close_all()


# Item 17: the lists a person uses, each checked at 1280 px.
LISTS = [
    "/admin/commands/failedcommand/",
    "/admin/commands/command/",
    "/admin/commands/connector/",
    "/admin/commands/attempt/",
    "/admin/commands/auditentry/",
    "/admin/commands/source/",
    "/admin/commands/delivery/",
    "/admin/limits/tenant/",
    "/admin/limits/apitoken/",
]


def fits_the_screen(page, what: str) -> None:
    """Nothing sticks out sideways: neither the page nor a list's own scroll box."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280, f"{what} is {width} px wide"
    for box in page.query_selector_all(".results"):
        scroll, client = box.evaluate("b => [b.scrollWidth, b.clientWidth]")
        assert scroll <= client, f"{what}'s list scrolls sideways: {scroll} > {client}"


def walk_through(world, start_node, browser) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    node = start_node(workers=1, threads=4)
    base = f"http://127.0.0.1:{node.port}"
    waiting, unsure = world["waiting"], world["unsure"]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(20_000)

    # Log in: the admin index is the dashboard.
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "ops-admin")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#ankusa-dashboard")
    assert page.locator("#ankusa-outcomes").count() == 1  # the SVG chart, drawn by the server
    # Item 13: the loop is paused, and the dashboard says so; it reloads itself.
    assert "No dispatch process has run a round for more than" in page.inner_text("#ankusa-alive-warning")
    assert "ops-box:4242" in page.inner_text("#ankusa-dispatchers")
    assert page.is_checked("#ankusa-refresh")
    fits_the_screen(page, "the dashboard")
    page.screenshot(path=str(SCREENSHOTS / "dashboard.png"), full_page=True)

    # Item 17: every list fits 1280 px without scrolling sideways.
    for path in LISTS:
        page.goto(f"{base}{path}")
        page.wait_for_selector("#changelist")
        fits_the_screen(page, path)

    # The failed list: each reason explained once (the legend; the badge's tooltip), not per row.
    page.goto(f"{base}/admin/commands/failedcommand/")
    page.wait_for_selector("#result_list")
    page.screenshot(path=str(SCREENSHOTS / "failed-list.png"), full_page=True)
    assert page.locator("#ankusa-legend").count() == 1
    assert page.locator("#result_list .ankusa-why:visible").count() == 0
    badge = page.locator("#result_list .ankusa-badge").first
    assert badge.get_attribute("title")  # the explanation, on hover
    for height in page.eval_on_selector_all(
        "#result_list tbody tr", "rows => rows.map(r => r.getBoundingClientRect().height)"
    ):
        assert height <= 80, height  # rows of at most four short lines, not 150-190 px
    assert page.is_visible("#ankusa-refresh")
    page.click("#ankusa-legend summary")
    assert "edit the connector" in page.inner_text("#ankusa-legend")

    # Item 12: the connector list at a glance; its failing count leads to its failed commands.
    page.goto(f"{base}/admin/commands/connector/")
    page.wait_for_selector("#result_list")
    row = page.locator("#result_list tbody tr", has_text="ledger")
    text = row.inner_text()
    assert "http://127.0.0.1:9/" in text
    assert "HTTPStatus" in text and "HTTP 503 from the receiver" in text and "UTC" in text
    assert "92% of 13" in text  # 12 sends that went out, one that failed, in 24 hours
    page.screenshot(path=str(SCREENSHOTS / "connector-list.png"), full_page=True)
    row.locator("td.field-failing_link a").click()
    page.wait_for_url("**connector__id__exact=**")
    assert page.locator("#result_list tbody tr").count() == 1
    assert str(unsure.pk) in page.inner_text("#result_list tbody tr")

    # Then only what waits for a configuration fix.
    page.goto(f"{base}/admin/commands/failedcommand/")
    page.locator("#changelist-filter a", has_text="after fix").first.click()
    page.wait_for_url("**reason=after-fix**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "the receiver asks for a configuration fix" in rows.first.locator(".ankusa-badge").get_attribute(
        "title"
    )

    # Items 10 and 11: the command's page — its actions, and its attempt with the answer, linked.
    rows.first.locator("th a").click()
    page.wait_for_selector(".field-connector_link a")
    attempt = page.locator("tr.ankusa-attempt").first
    assert "HTTP 401" in attempt.inner_text() and "the loop" in attempt.inner_text()
    assert attempt.locator("a").get_attribute("href").startswith("/admin/commands/attempt/")
    assert page.locator("#ankusa-command-actions button").all_inner_texts() == ["Resend…", "Cancel…"]
    fits_the_screen(page, "a command's page")
    page.screenshot(path=str(SCREENSHOTS / "command-detail.png"), full_page=True)
    page.locator(".field-connector_link a").click()
    page.wait_for_selector("#id_secret")
    page.fill("#id_secret", "Bearer fixed-token")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist")

    # Saving the connector queued the command (the dispatch poll sends it), and said so.
    assert "1 of its commands will now go" in page.inner_text(".messagelist")
    waiting.refresh_from_db()
    assert (waiting.state, waiting.skip_reason) == (State.QUEUED, "")
    world["broken"].refresh_from_db()
    assert world["broken"].secret == "Bearer fixed-token"

    # Resend the other failed command from its own page: it needs an override, with a typed reason.
    page.goto(f"{base}/admin/commands/command/{unsure.pk}/change/")
    assert "need an override" in page.inner_text("#ankusa-command-actions")
    page.click("button[name=ankusa-resend]")
    page.wait_for_selector("#ankusa-plan")
    assert page.inner_text("#ankusa-total") == "1"
    assert "need an override" in page.inner_text("#ankusa-plan")
    page.screenshot(path=str(SCREENSHOTS / "resend-confirmation.png"), full_page=True)
    page.check("#id_override")
    page.fill("#id_reason", "checked the ledger: entry E-7 never arrived")
    page.click("input[value='Yes, resend']")
    page.wait_for_selector(".messagelist")
    assert "1 resent" in page.inner_text(".messagelist")
    # Back on the command list, narrowed to that one command.
    assert page.locator("#result_list tbody tr").count() == 1

    unsure.refresh_from_db()
    assert unsure.resend_by_id == world["user"].pk

    # The audit row is there, in its list and in the database.
    page.goto(f"{base}/admin/commands/auditentry/")
    row = page.locator("#result_list tbody tr").first
    assert "resend with override" in row.inner_text()
    assert "checked the ledger" in row.inner_text()
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.via, entry.username, entry.done) == (
        "resend-override",
        "admin",
        "ops-admin",
        1,
    )
    assert list(entry.commands.values_list("pk", flat=True)) == [unsure.pk]
