"""A row's tenant never changes, a tenant's slug never changes, and a source fans out only to its own
tenant's connectors — through the admin's change forms, the API and the ORM alike."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from commands.checks import check_connectors
from commands.models import Command, Connector, Source
from limits.models import ApiToken, LimitOverride, Tenant

FIXED = "The tenant of an existing row does not change."
OWN = "A source fans out only to its own tenant's connectors."


@pytest.fixture
def staff(client, world):
    client.force_login(User.objects.get(username="admin"))
    return client


def change_form(staff, path: str) -> dict:
    """The change form's fields as the page renders them (what a browser would post back)."""
    response = staff.get(path)
    assert response.status_code == 200
    data = {}
    form = response.context["adminform"].form
    for name in form.fields:
        value = form[name].value()
        if isinstance(value, list):
            data[name] = [str(v) for v in value]
        elif isinstance(value, bool):
            if value:
                data[name] = "on"
        elif value is not None:
            data[name] = value if isinstance(value, str) else str(value)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for name in formset.management_form.fields:
            data[f"{formset.prefix}-{name}"] = formset.management_form[name].value()
        for form in formset.forms:
            for name in form.fields:
                value = form[name].value()
                if value is not None and value is not False:
                    data[form.add_prefix(name)] = "on" if value is True else str(value)
    return data


# --- the admin ------------------------------------------------------------------------------------


def test_the_admin_shows_a_connectors_tenant_read_only_and_ignores_a_posted_one(staff, world):
    connector = world.a.connector
    path = f"/admin/commands/connector/{connector.pk}/change/"
    data = change_form(staff, path)
    assert "tenant" not in data  # read-only on change: not a form field
    response = staff.post(path, {**data, "tenant": str(world.b.tenant.pk), "name": "moved"})
    assert response.status_code == 302
    connector.refresh_from_db()
    assert (connector.name, connector.tenant_id) == ("moved", world.a.tenant.pk)


def test_the_admin_keeps_a_sources_tenant_and_refuses_another_tenants_connector(staff, world):
    source = world.a.source
    path = f"/admin/commands/source/{source.pk}/change/"
    data = change_form(staff, path)
    assert "tenant" not in data
    response = staff.post(path, {**data, "tenant": str(world.b.tenant.pk)})
    assert response.status_code == 302
    source.refresh_from_db()
    assert source.tenant_id == world.a.tenant.pk
    response = staff.post(
        path, {**data, "connectors": [str(world.a.connector.pk), str(world.b.connector.pk)]}
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.non_field_errors() == [OWN]
    assert list(source.connectors.all()) == [world.a.connector]


def test_the_admin_keeps_a_tenants_slug(staff, world):
    tenant = world.a.tenant
    path = f"/admin/limits/tenant/{tenant.pk}/change/"
    data = change_form(staff, path)
    assert "slug" not in data
    response = staff.post(path, {**data, "slug": "renamed", "name": "Acme Two"})
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert (tenant.slug, tenant.name) == ("acme", "Acme Two")


def test_the_admin_keeps_a_tokens_tenant(staff, world):
    token = ApiToken.objects.get(tenant=world.a.tenant)
    path = f"/admin/limits/apitoken/{token.pk}/change/"
    data = change_form(staff, path)
    response = staff.post(path, {**data, "tenant": str(world.b.tenant.pk), "name": "renamed"})
    assert response.status_code == 302
    token.refresh_from_db()
    assert (token.name, token.tenant_id) == ("renamed", world.a.tenant.pk)


# --- the API --------------------------------------------------------------------------------------


def test_the_api_refuses_to_move_a_connector_or_source_or_rename_a_tenant(world, call):
    status, data = call("admin", "PATCH", f"/api/v1/connectors/{world.a.connector.pk}/", {"tenant": "globex"})
    assert (status, data["fields"]) == (400, {"tenant": [FIXED]})
    status, data = call("admin", "PATCH", f"/api/v1/sources/{world.a.source.pk}/", {"tenant": "globex"})
    assert (status, data["fields"]) == (400, {"tenant": [FIXED]})
    status, data = call("admin", "PATCH", f"/api/v1/sources/{world.a.source.pk}/",
                        {"connectors": [world.b.connector.pk]})  # fmt: skip
    assert status == 400
    status, data = call("admin", "PATCH", "/api/v1/tenants/acme/", {"slug": "renamed"})
    assert (status, data["fields"]) == (400, {"slug": ["A tenant's slug does not change."]})
    assert Tenant.objects.filter(slug="acme").exists()


# --- the ORM (the shell) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows",
    [
        lambda w: Connector.objects.get(pk=w.a.connector.pk),
        lambda w: Source.objects.get(pk=w.a.source.pk),
        lambda w: LimitOverride.objects.get(tenant=w.a.tenant),
        lambda w: ApiToken.objects.get(tenant=w.a.tenant),
    ],
    ids=["connector", "source", "override", "token"],
)
def test_the_orm_refuses_to_move_a_row_to_another_tenant(world, rows):
    row = rows(world)
    row.tenant = world.b.tenant
    with pytest.raises(ValidationError) as cleaned:
        row.full_clean()
    assert cleaned.value.message_dict["tenant"] == [FIXED]
    with pytest.raises(ValidationError) as saved:
        row.save()
    assert saved.value.message_dict == {"tenant": [FIXED]}
    assert type(row).objects.get(pk=row.pk).tenant_id == world.a.tenant.pk


def test_a_forged_instance_with_an_existing_id_cannot_move_the_row(world):
    forged = Connector(pk=world.a.connector.pk, tenant=world.b.tenant, name="billing", kind="log")
    with pytest.raises(ValidationError):
        forged.save()
    assert Connector.objects.get(pk=world.a.connector.pk).tenant_id == world.a.tenant.pk


def test_saving_other_fields_of_a_row_reads_nothing_more(world, django_assert_num_queries):
    connector = Connector.objects.get(pk=world.a.connector.pk)
    connector.name = "renamed"
    with django_assert_num_queries(0):
        connector.fixed_field_errors(update_fields=["name"])
    with django_assert_num_queries(1):
        assert connector.fixed_field_errors() == {}


def test_the_orm_refuses_to_rename_a_tenant(world):
    tenant = Tenant.objects.get(slug="acme")
    tenant.slug = "renamed"
    with pytest.raises(ValidationError) as saved:
        tenant.save()
    assert saved.value.message_dict == {"slug": ["A tenant's slug does not change."]}
    tenant.name = "Acme Two"
    tenant.slug = "acme"
    tenant.save()  # the other fields still change


def test_the_orm_refuses_to_link_a_source_to_another_tenants_connector(world):
    for link in (
        lambda: world.a.source.connectors.add(world.b.connector),
        lambda: world.a.source.connectors.set([world.a.connector, world.b.connector]),
        lambda: world.b.connector.sources.add(world.a.source),
    ):
        with pytest.raises(ValidationError) as raised, transaction.atomic():
            link()
        assert raised.value.message_dict == {"connectors": [OWN]}
    assert list(world.a.source.connectors.all()) == [world.a.connector]
    world.a.source.connectors.add(world.a.spare_connector)  # its own tenant's: fine


# --- rows from before the rules -------------------------------------------------------------------


def test_manage_py_check_lists_rows_joined_across_tenants(world):
    assert [w for w in check_connectors(None) if w.id == "commands.W003"] == []
    Source.connectors.through.objects.create(source=world.a.source, connector=world.b.spare_connector)
    moved = Connector.objects.filter(pk=world.b.connector.pk)
    moved.update(tenant=world.a.tenant, name="moved")  # past save()
    [warning] = [w for w in check_connectors(None) if w.id == "commands.W003"]
    b_command = Command.objects.get(tenant=world.b.tenant)
    assert warning.msg == (
        "Rows joined across tenants: globex/orders -> acme/moved, "
        f"acme/orders -> globex/spare, command {b_command.pk}."
    )
