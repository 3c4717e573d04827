"""The console's small things (issue 22, items 15, 19, 22): no dead "View site", a favicon, objects
named by slug, one date format with its zone, Redoc loading nothing from elsewhere, "Secret:" once on
the connector form, the all-commands list's tenant and connector filters, the API token form's user
found by name, and no delete that can never work."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from commands.models import Command, Connector, Source
from commands.states import State
from limits.models import LimitOverride, Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(admin_client):
    return admin_client


@pytest.fixture
def connector():
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    return Connector.objects.create(tenant=tenant, name="crm-401", kind="http", url="http://127.0.0.1:9/")


def test_there_is_no_view_site_link(staff):
    html = staff.get(reverse("admin:index")).content.decode()
    assert "View site" not in html


def test_favicon_is_an_icon(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/x-icon"
    body = response.content
    assert body[:4] == b"\x00\x00\x01\x00" and b"\x89PNG" in body
    assert "max-age=86400" in response["Cache-Control"]
    assert client.post("/favicon.ico").status_code == 405


def test_objects_are_named_by_their_tenants_slug(connector):
    source = Source.objects.create(tenant=connector.tenant, slug="shop")
    override = LimitOverride.objects.create(tenant=connector.tenant, kind="hooks", rate=1, burst=2)
    assert (str(connector), str(source), str(override)) == (
        "acme/crm-401",
        "acme/shop",
        "acme:hooks 1/s burst 2",
    )


def test_dates_read_one_way_with_their_zone_on_lists_and_pages(staff, connector):
    command = Command.objects.create(tenant=connector.tenant, connector=connector, state=State.FAILED)
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    listing = staff.get(reverse("admin:commands_command_changelist")).content.decode()
    page = staff.get(reverse("admin:commands_command_change", args=[command.pk])).content.decode()
    for html in (listing, page):
        assert re.search(stamp, html)
        assert not re.search(r"[ap]\.m\.", html)  # Django's "1:28 p.m."


def test_redoc_loads_no_font_and_no_logo_from_elsewhere(client):
    page = client.get("/api/redoc/").content.decode()
    assert "fonts.googleapis" not in page and "fonts.gstatic" not in page
    # The logo's address is inside Redoc's script: the page's policy refuses to fetch it.
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "img-src 'self' data:" in policy and "default-src 'self'" in policy
    assert "/static/drf_spectacular_sidecar/" in page


def test_the_connector_form_says_secret_once(staff, connector):
    html = staff.get(reverse("admin:commands_connector_change", args=[connector.pk])).content.decode()
    labels = re.findall(r"<label[^>]*>([^<]*)</label>", html)
    assert [label for label in labels if label.strip().lower() == "secret:"] == ["Secret:"]
    assert "Stored secret:" in labels


def test_the_command_list_filters_by_tenant_and_connector(staff, connector):
    other_tenant = Tenant.objects.create(slug="globex", name="Globex")
    other = Connector.objects.create(tenant=other_tenant, name="ledger", kind="log")
    mine = Command.objects.create(tenant=connector.tenant, connector=connector)
    theirs = Command.objects.create(tenant=other_tenant, connector=other)
    url = reverse("admin:commands_command_changelist")
    html = staff.get(url).content.decode()
    assert "By tenant" in html and "By connector" in html
    assert ">acme/crm-401</a>" in html and ">globex/ledger</a>" in html

    def ids(query):
        page = staff.get(url, query).content.decode()
        return set(map(int, re.findall(r'name="_selected_action" value="(\d+)"', page)))

    assert ids({"tenant__id__exact": other_tenant.pk}) == {theirs.pk}
    assert ids({"connector__id__exact": connector.pk}) == {mine.pk}


def test_the_token_forms_user_is_chosen_by_name(staff):
    html = staff.get(reverse("admin:limits_apitoken_add")).content.decode()
    user_field = re.search(r'<select name="user"[^>]*>', html).group(0)
    assert "admin-autocomplete" in user_field
    assert 'data-field-name="user"' in user_field
    assert 'name="user" class="vForeignKeyRawIdAdminField"' not in html


def test_a_tenant_with_commands_has_no_delete_and_one_without_has(staff, connector):
    Command.objects.create(tenant=connector.tenant, connector=connector)
    empty = Tenant.objects.create(slug="empty", name="Empty")
    busy = reverse("admin:limits_tenant_change", args=[connector.tenant.pk])
    assert "deletelink" not in staff.get(busy).content.decode()
    assert staff.get(reverse("admin:limits_tenant_delete", args=[connector.tenant.pk])).status_code == 403
    assert "deletelink" in staff.get(reverse("admin:limits_tenant_change", args=[empty.pk])).content.decode()
    listing = staff.get(reverse("admin:limits_tenant_changelist")).content.decode()
    assert 'value="delete_selected"' not in listing


def test_a_user_is_still_found_by_the_token_forms_autocomplete(staff):
    User.objects.create_user("ops-jane", "jane@example.com", "pw", is_staff=True)
    response = staff.get(
        reverse("admin:autocomplete"),
        {"term": "jane", "app_label": "limits", "model_name": "apitoken", "field_name": "user"},
    )
    assert response.status_code == 200
    assert [r["text"] for r in response.json()["results"]] == ["ops-jane"]


def test_a_connector_or_source_with_history_has_no_delete_button_and_unused_ones_have(staff, connector):
    source = Source.objects.create(tenant=connector.tenant, slug="shop")
    spare = Connector.objects.create(tenant=connector.tenant, name="spare", kind="log")
    spare_source = Source.objects.create(tenant=connector.tenant, slug="spare")
    Command.objects.create(tenant=connector.tenant, connector=connector, source=source)
    for name, used, unused in (("connector", connector, spare), ("source", source, spare_source)):
        used_page = staff.get(reverse(f"admin:commands_{name}_change", args=[used.pk])).content.decode()
        assert "deletelink" not in used_page
        assert staff.get(reverse(f"admin:commands_{name}_delete", args=[used.pk])).status_code == 403
        unused_page = staff.get(reverse(f"admin:commands_{name}_change", args=[unused.pk])).content.decode()
        assert "deletelink" in unused_page
