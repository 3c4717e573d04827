"""Tenant and connector pages: effective limits with their source, and a credential never shown back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from limits.models import LimitOverride
from tests.commands.staff import login_as

SECRET = "Bearer s3cr3t-never-shown"


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def test_the_tenant_list_and_page_show_effective_limits_and_their_source(staff, tenant, settings):
    settings.ANKUSA_DEFAULT_BYTES_RATE, settings.ANKUSA_DEFAULT_BYTES_BURST = 1000.0, 5000
    tenant.hooks_rate, tenant.hooks_burst = 5.0, 10
    tenant.save()
    LimitOverride.objects.create(
        tenant=tenant,
        kind="hooks",
        rate=50,
        burst=100,
        reason="launch",
        expires_at=timezone.now() + timedelta(days=1),
    )
    listing = staff.get(reverse("admin:limits_tenant_changelist")).content.decode()
    page = staff.get(reverse("admin:limits_tenant_change", args=[tenant.pk])).content.decode()
    assert "50/s, burst 100 (override)" in listing and "1000/s, burst 5000 (site default)" in listing
    assert "hooks: 50/s, burst 100 (override) until" in page
    assert "bytes: 1000/s, burst 5000 (site default)" in page


def test_the_tenants_own_limit_is_named_as_its_source(staff, tenant):
    tenant.hooks_rate, tenant.hooks_burst = 5.0, 10
    tenant.save()
    page = staff.get(reverse("admin:limits_tenant_change", args=[tenant.pk])).content.decode()
    assert "hooks: 5/s, burst 10 (tenant&#x27;s own); bytes: unlimited" in page


@pytest.mark.parametrize("group", [None, "viewer", "operator", "admin"])
def test_no_connector_page_ever_contains_the_secret(client, make_connector, group):
    login_as(client, group, username=f"u-{group}")
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization", secret=SECRET)
    pages = [
        reverse("admin:commands_connector_changelist"),
        reverse("admin:commands_connector_change", args=[connector.pk]),
        reverse("admin:commands_connector_history", args=[connector.pk]),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        assert "s3cr3t" not in response.content.decode(), url
    change = client.get(pages[1]).content.decode()
    assert "set" in change and 'type="password"' in change or group == "viewer"


def test_a_refused_connector_form_does_not_echo_the_typed_secret(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization")
    response = staff.post(
        reverse("admin:commands_connector_change", args=[connector.pk]),
        {
            "tenant": connector.tenant_id,
            "name": connector.name,
            "kind": "http",
            "url": "not a url",
            "method": "POST",
            "headers": "{}",
            "status_map": "{}",
            "secret_header": "Authorization",
            "secret": SECRET,
        },
    )
    assert response.status_code == 200  # the form again, with the URL error
    assert "s3cr3t" not in response.content.decode()
    connector.refresh_from_db()
    assert connector.secret == ""


def test_the_command_page_never_shows_its_connectors_secret(staff, make_connector, make_command):
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization", secret=SECRET)
    command = make_command(connector)
    page = staff.get(reverse("admin:commands_command_change", args=[command.pk])).content.decode()
    assert "s3cr3t" not in page


@pytest.mark.parametrize("group", [None, "viewer", "operator", "admin"])
def test_no_source_page_ever_contains_a_signing_secret(client, tenant, group):
    from commands.models import Source

    login_as(client, group, username=f"u-{group}")
    source = Source.objects.create(
        tenant=tenant, slug="orders", verifier="github", verifier_secrets=["whsec-s3cr3t"]
    )
    for url in (
        reverse("admin:commands_source_changelist"),
        reverse("admin:commands_source_change", args=[source.pk]),
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        assert "s3cr3t" not in response.content.decode(), url
