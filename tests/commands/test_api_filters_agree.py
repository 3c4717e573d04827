"""The API's command filters read as the admin's (item 21 of issue 22): ``skip_reason`` files a
command where its badge does (``after-fix`` apart from ``backing-off``), and ``connector`` takes an
id or a name — in the list and in a bulk action's ``filter``."""

from __future__ import annotations

import pytest
from django.urls import reverse

from commands.models import Connector
from commands.retry import SkipReason
from commands.staff.explain import AFTER_FIX, NO_REASON, RESEND_PENDING
from limits.models import Tenant
from tests.commands.staff import login_as, make_failed
from tests.staff import api_client, staff_user

LIST = reverse("admin:commands_failedcommand_changelist")


@pytest.fixture
def commands(make_connector):
    connector = make_connector("crm-401", url="http://127.0.0.1:9/", idempotent=True)
    return {
        "wobble": make_failed(connector, outlook="again", reason="backing-off"),
        "fix": make_failed(connector, outlook="after-fix", reason="backing-off"),
        "fix_undecided": make_failed(connector, outlook="after-fix", reason=""),
        "never": make_failed(connector, outlook="never", reason="never"),
    }


@pytest.fixture
def api_ids(db):
    viewer = api_client(staff_user("viewer"))

    def ids(query: str) -> set[int]:
        response = viewer.get(f"/api/v1/commands/?{query}")
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    return ids


@pytest.mark.parametrize("reason", [AFTER_FIX, *SkipReason.values, RESEND_PENDING, NO_REASON])
def test_each_skip_reason_lists_the_same_commands_in_the_api_and_the_admin(client, commands, api_ids, reason):
    login_as(client, None)
    admin_ids = {c.pk for c in client.get(LIST, {"reason": reason}).context["cl"].result_list}
    assert api_ids(f"skip_reason={reason}") == admin_ids


def test_backing_off_leaves_out_the_after_fix_commands(commands, api_ids):
    assert api_ids("skip_reason=backing-off") == {commands["wobble"].pk}
    assert api_ids("skip_reason=after-fix") == {commands["fix"].pk, commands["fix_undecided"].pk}


def test_the_connector_filter_takes_an_id_or_a_name(commands, tenant, api_ids):
    other = Tenant.objects.create(slug="other", name="Other")
    elsewhere = make_failed(
        Connector.objects.create(tenant=other, name="crm-401", kind="log"), reason="never"
    )
    connector = commands["never"].connector
    mine = {c.pk for c in commands.values()}
    assert api_ids(f"connector={connector.pk}") == mine
    assert api_ids("connector=crm-401&tenant=acme") == mine
    assert api_ids("connector=crm-401") == mine | {elsewhere.pk}  # one name, two tenants
    assert api_ids("connector=nobody") == set()
    assert api_ids("connector=99999999999999999999") == set()


def test_a_bulk_filter_reads_the_same_way(commands):
    operator = api_client(staff_user("operator", "op"))
    response = operator.post(
        "/api/v1/commands/cancel/",
        {"filter": {"skip_reason": "after-fix", "connector": "crm-401"}, "dry_run": True},
        format="json",
    )
    assert (response.status_code, response.json()["total"]) == (200, 2)
