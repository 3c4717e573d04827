"""Admin: usable for the demo, never showing a credential back, cheap list pages."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from commands.models import Attempt, Command, Connector
from commands.states import State

SECRET = "Bearer very-secret-token-123"


@pytest.fixture
def staff(admin_client):
    return admin_client


def test_the_connector_page_never_shows_the_secret(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization", secret=SECRET)
    change = staff.get(reverse("admin:commands_connector_change", args=[connector.pk]))
    listing = staff.get(reverse("admin:commands_connector_changelist"))
    assert change.status_code == listing.status_code == 200
    for page in (change, listing):
        assert SECRET not in page.content.decode()
        assert "very-secret" not in page.content.decode()
    assert '<div class="readonly">set</div>' in change.content.decode()  # whether one is stored


def form_data(connector: Connector, **changes) -> dict:
    data = {
        "tenant": connector.tenant_id,
        "name": connector.name,
        "kind": connector.kind,
        "enabled": "on",
        "url": connector.url,
        "method": connector.method,
        "headers": "{}",
        "status_map": "{}",
        "secret_header": connector.secret_header,
        "secret": "",
    }
    data.update(changes)
    return data


def test_saving_with_an_empty_secret_keeps_the_stored_one(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization", secret=SECRET)
    url = reverse("admin:commands_connector_change", args=[connector.pk])
    response = staff.post(url, form_data(connector, name="renamed"))
    assert response.status_code == 302
    connector.refresh_from_db()
    assert (connector.name, connector.secret) == ("renamed", SECRET)


def test_a_new_secret_replaces_it_and_clearing_removes_it(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization", secret=SECRET)
    url = reverse("admin:commands_connector_change", args=[connector.pk])
    staff.post(url, form_data(connector, secret="Bearer new"))
    connector.refresh_from_db()
    assert connector.secret == "Bearer new"
    staff.post(url, form_data(connector, clear_secret="on"))
    connector.refresh_from_db()
    assert connector.secret == ""


def test_the_connector_page_lists_its_problems(staff, make_connector):
    connector = make_connector(url="", secret_header="Authorization")
    page = staff.get(reverse("admin:commands_connector_change", args=[connector.pk])).content.decode()
    assert "no URL; missing credential for the Authorization header" in page


def test_a_source_cannot_fan_out_to_another_tenants_connector(staff, tenant, make_connector):
    from limits.models import Tenant

    stranger = Tenant.objects.create(slug="b", name="B")
    foreign = Connector.objects.create(tenant=stranger, name="x", kind="log")
    response = staff.post(
        reverse("admin:commands_source_add"), {"tenant": tenant.pk, "slug": "s", "connectors": [foreign.pk]}
    )
    assert response.status_code == 200
    assert "A source fans out only to its own tenant&#x27;s connectors." in response.content.decode()


def test_staff_can_add_a_command_which_starts_approved(staff, tenant, make_connector):
    connector = make_connector(kind="log")
    response = staff.post(
        reverse("admin:commands_command_add"),
        {
            "tenant": tenant.pk,
            "connector": connector.pk,
            "payload": '{"order": "A-9"}',
            "idempotency_key": "",
            "attempt_set-TOTAL_FORMS": "0",
            "attempt_set-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302
    command = Command.objects.get()
    assert (command.state, command.payload) == (State.APPROVED, {"order": "A-9"})


def test_attempts_are_history_and_cannot_be_changed(staff, make_connector, make_command):
    from django.utils import timezone

    attempt = Attempt.objects.create(
        command=make_command(make_connector()), number=1, started_at=timezone.now()
    )
    assert staff.get(reverse("admin:commands_attempt_change", args=[attempt.pk])).status_code == 200
    assert (
        staff.post(reverse("admin:commands_attempt_delete", args=[attempt.pk]), {"post": "yes"}).status_code
        == 403
    )
    assert Attempt.objects.count() == 1


@pytest.mark.parametrize("model", ["command", "attempt", "connector", "source"])
def test_list_pages_cost_the_same_queries_for_3_and_30_rows(staff, make_connector, make_command, model):
    from django.utils import timezone

    def fill(n):
        for _ in range(n):
            connector = make_connector(f"c{Connector.objects.count()}", kind="log")
            command = make_command(connector)
            Attempt.objects.create(command=command, number=1, started_at=timezone.now())

    url = reverse(f"admin:commands_{model}_changelist")

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(url).status_code == 200
        return len(captured)

    fill(3)
    few = queries()
    fill(27)
    assert queries() == few
