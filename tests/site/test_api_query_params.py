"""A list's query parameters: each one is a filter, the pagination's cursor or ``format``; anything
else is a 400 that names it, never a filter silently left out that answers every row."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from commands.models import Connector

COMMAND_PARAMS = "connector, cursor, format, last_outlook, skip_reason, state, tenant"


def test_a_misspelt_filter_is_a_400_naming_it_and_the_known_ones(world, call):
    status, data = call("admin", "GET", "/api/v1/commands/?stat=failed")
    assert (status, data["error"]) == (400, "invalid")
    assert data["fields"] == {"stat": [f"Unknown query parameter; use {COMMAND_PARAMS}."]}


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/tenants/",
        "/api/v1/sources/",
        "/api/v1/connectors/",
        "/api/v1/commands/",
        "/api/v1/deliveries/",
        "/api/v1/audit-entries/",
    ],
)
def test_every_list_refuses_a_parameter_it_does_not_know_and_takes_format(world, call, path):
    status, data = call("admin", "GET", f"{path}?sort=-id")
    assert (status, list(data["fields"])) == (400, ["sort"])
    status, data = call("admin", "GET", f"{path}?format=json")
    assert (status, "results" in data) == (200, True)


@pytest.mark.parametrize("path", ["/api/v1/queues/", "/api/v1/commands/{pk}/attempts/"])
def test_the_lists_outside_the_model_lists_refuse_an_unknown_parameter_too(world, call, path):
    status, data = call("admin", "GET", path.format(pk=world.a.command.pk) + "?foo=1")
    assert (status, list(data["fields"])) == (400, ["foo"])
    status, data = call("admin", "GET", path.format(pk=world.a.command.pk) + "?format=json")
    assert status == 200


def test_a_tenant_token_gets_the_same_answer_for_an_unknown_parameter(world, call):
    status, data = call("tenant_a", "GET", "/api/v1/commands/?tenat=globex")
    assert (status, list(data["fields"])) == (400, ["tenat"])


def test_known_filters_and_the_next_pages_cursor_pass(world, call):
    status, data = call("admin", "GET", "/api/v1/commands/?state=failed&tenant=globex")
    assert status == 200
    assert {row["tenant"] for row in data["results"]} == {"globex"}
    Connector.objects.bulk_create(
        Connector(tenant=world.a.tenant, name=f"extra-{n}", url="https://x.example/") for n in range(60)
    )
    status, first = call("admin", "GET", "/api/v1/connectors/?tenant=acme")
    assert status == 200 and first["next"]
    status, second = call("admin", "GET", urlsplit(first["next"])._replace(scheme="", netloc="").geturl())
    assert status == 200
    assert (
        len(first["results"]) + len(second["results"])
        == Connector.objects.filter(tenant=world.a.tenant).count()
    )


def test_an_unknown_parameter_on_one_row_is_not_refused(world, call):
    status, _ = call("admin", "GET", f"/api/v1/commands/{world.a.command.pk}/?expand=attempts")
    assert status == 200


@pytest.mark.parametrize(
    ("value", "enabled"), [("true", {True}), ("FALSE", {False}), ("1", {True}), ("", {True, False})]
)
def test_a_boolean_filter_takes_true_or_false(world, call, value, enabled):
    Connector.objects.create(tenant=world.a.tenant, name="off", url="https://x.example/", enabled=False)
    status, data = call("admin", "GET", f"/api/v1/connectors/?enabled={value}")
    assert status == 200
    assert {row["enabled"] for row in data["results"]} == enabled


@pytest.mark.parametrize("value", ["maybe", "yes", "2"])
def test_a_boolean_filter_refuses_anything_else(world, call, value):
    status, data = call("admin", "GET", f"/api/v1/connectors/?enabled={value}")
    assert (status, data["fields"]) == (400, {"enabled": ["Use true or false."]})
