"""Hostile input found by fuzzing the REST API: each is a 4xx in the JSON error shape, never a 500.

A cursor whose position cannot be a value of the list's ordering field answers like any other
invalid cursor; a body holding a NUL character or a lone surrogate is refused by the parser, before
any serializer echoes it or any query carries it; a slug in a URL that no tenant can have is a 404
that asks the database nothing.
"""

from __future__ import annotations

import base64
from urllib.parse import quote, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from commands.models import Command, Connector
from limits.models import Tenant

INVALID_CURSOR = {"error": "not_found", "detail": "Invalid cursor"}
UNSTORABLE = {
    "error": "parse_error",
    "detail": "The JSON holds a NUL character or a lone surrogate, which cannot be stored.",
}


def cursor(decoded: str) -> str:
    return quote(base64.b64encode(decoded.encode()).decode())


def local(url: str) -> str:
    return urlsplit(url)._replace(scheme="", netloc="").geturl()


ID_LISTS = ["/api/v1/commands/", "/api/v1/deliveries/", "/api/v1/audit-entries/", "/api/v1/connectors/",
            "/api/v1/sources/", "attempts"]  # fmt: skip


@pytest.mark.parametrize("path", ID_LISTS)
@pytest.mark.parametrize(
    "position", ["p=abc", "p=", "p=1.5", "p=2026-01-01", "r=1&p=z", "p=1e3", "o=1&p=%00", "p=-"]
)
def test_a_cursor_position_that_is_not_a_number_is_an_invalid_cursor(world, call, path, position):
    if path == "attempts":
        path = f"/api/v1/commands/{world.a.command.pk}/attempts/"
    assert call("admin", "GET", f"{path}?cursor={cursor(position)}") == (404, INVALID_CURSOR)


@pytest.mark.parametrize("path", [*ID_LISTS, "/api/v1/tenants/"])
@pytest.mark.parametrize("value", ["abc", cursor("o=x"), cursor("r=x&p=1")])
def test_an_undecodable_cursor_is_the_same_invalid_cursor(world, call, path, value):
    if path == "attempts":
        path = f"/api/v1/commands/{world.a.command.pk}/attempts/"
    assert call("admin", "GET", f"{path}?cursor={value}") == (404, INVALID_CURSOR)


@pytest.mark.parametrize(
    ("position", "found"), [("p=9223372036854775808", 2), ("p=-99999999999999999999999", 0)]
)
def test_a_cursor_position_that_is_a_whole_number_pages_from_there(world, call, position, found):
    status, data = call("admin", "GET", f"/api/v1/commands/?cursor={cursor(position)}")
    assert (status, len(data["results"])) == (200, found)


@pytest.mark.parametrize("position", ["p=\x00", "p=a\x00b", "r=1&p=\x00"])
def test_a_tenant_cursor_position_holding_a_nul_is_an_invalid_cursor(world, call, position):
    assert call("admin", "GET", f"/api/v1/tenants/?cursor={cursor(position)}") == (404, INVALID_CURSOR)


def test_a_tenant_cursor_position_between_slugs_pages_from_there(world, call):
    status, data = call("admin", "GET", f"/api/v1/tenants/?cursor={cursor('p=b')}")
    assert (status, [row["slug"] for row in data["results"]]) == (200, ["globex"])


def test_the_cursors_the_api_gives_walk_the_list_both_ways(world, call):
    Command.objects.bulk_create(
        Command(tenant=world.a.tenant, connector=world.a.connector, payload={}) for _ in range(60)
    )
    Tenant.objects.bulk_create(Tenant(slug=f"t-{n:02}", name="t") for n in range(60))
    for path, total in [("/api/v1/commands/", Command.objects.count()), ("/api/v1/tenants/", 62)]:
        status, first = call("admin", "GET", path)
        status, second = call("admin", "GET", local(first["next"]))
        assert (status, len(first["results"]) + len(second["results"])) == (200, total)
        status, back = call("admin", "GET", local(second["previous"]))
        assert (status, back["results"]) == (200, first["results"])


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", "/api/v1/tenants/acme/", {"\ud800": 1}),
        ("PATCH", "/api/v1/tenants/acme/", {"name": "nul\u0000"}),
        ("POST", "/api/v1/connectors/", {"tenant": "acme", "name": "n", "kind": "\ud800"}),
        ("POST", "/api/v1/commands/resend/", {"dry_run": True, "filter": {"state": "\ud800"}}),
        ("POST", "/api/v1/commands/resend/", {"dry_run": True, "ids": [1], "reason": "\udfff"}),
        ("PATCH", "/api/v1/connectors/{connector}/", {"headers": {"X-A": "nul\u0000"}}),
        ("PATCH", "/api/v1/sources/{source}/", {"verifier_options": {"tolerance_s": ["\u0000"]}}),
        ("PUT", "/api/v1/tenants/acme/limits/hooks/", {"rate": 1, "burst": 1, "reason": "\ud83d"}),
    ],
)
def test_a_body_holding_a_nul_or_a_lone_surrogate_is_a_parse_error(world, call, method, path, body):
    path = path.format(connector=world.a.connector.pk, source=world.a.source.pk)
    assert call("admin", method, path, body) == (400, UNSTORABLE)
    assert Tenant.objects.get(slug="acme").name == "Acme"


def test_a_body_with_a_paired_surrogate_is_read_as_its_character(world, call):
    status, data = call("admin", "PATCH", "/api/v1/tenants/acme/", {"name": "Acme \ud83d\ude80"})
    assert (status, data["name"]) == (200, "Acme \U0001f680")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/connectors/", {"tenant": "a\u0000b", "name": "zz", "kind": "log"}),
        ("PATCH", "/api/v1/sources/{source}/", {"tenant": "\u0000"}),
    ],
)
def test_a_tenant_slug_holding_a_nul_in_a_body_is_a_parse_error(world, call, method, path, body):
    before = Connector.objects.count()
    assert call("admin", method, path.format(source=world.a.source.pk), body) == (400, UNSTORABLE)
    assert Connector.objects.count() == before


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
@pytest.mark.parametrize("slug", ["%00", "a%00b", "acme%0A", "bad.slug", "x" * 65])
def test_a_tenant_slug_in_the_url_no_tenant_can_have_is_a_404_without_looking(world, call, method, slug):
    body = {"rate": 1, "burst": 1} if method == "PUT" else None
    with CaptureQueriesContext(connection) as queries:
        status, data = call("admin", method, f"/api/v1/tenants/{slug}/limits/hooks/", body)
    assert (status, data["error"]) == (404, "not_found")
    assert not [q["sql"] for q in queries if 'FROM "limits_tenant"' in q["sql"] and '"slug"' in q["sql"]]


@pytest.mark.parametrize("slug", ["%00", "acme%0A"])
def test_a_tenant_slug_no_tenant_can_have_is_a_404_on_the_tenant_too(world, call, slug):
    status, data = call("admin", "GET", f"/api/v1/tenants/{slug}/")
    assert (status, data["error"]) == (404, "not_found")


def test_a_tenant_limit_is_still_found_by_its_slug(world, call):
    status, data = call("admin", "GET", "/api/v1/tenants/acme/limits/bytes/")
    assert (status, data["tenant"], data["rate"]) == (200, "acme", 100)


@pytest.mark.parametrize(
    "path",
    ["/api/v1/connectors/?tenant=%00", "/api/v1/commands/?tenant=a%00", "/api/v1/deliveries/?source=%00",
     "/api/v1/deliveries/?event_key=%00", "/api/v1/sources/?tenant=%00"],
)  # fmt: skip
def test_a_filter_holding_a_nul_is_a_400(world, call, path):
    status, data = call("admin", "GET", path)
    assert (status, data["error"]) == (400, "invalid")


def test_a_body_is_parsed_by_the_intakes_rule_so_a_number_postgresql_cannot_keep_is_refused(world):
    response = world.client("admin").patch(
        "/api/v1/tenants/acme/", b'{"name": "Acme 2", "x": 1e-16384}', content_type="application/json"
    )
    assert (response.status_code, response.json()) == (
        400,
        {
            "error": "parse_error",
            "detail": "The JSON holds a number with more than 16383 digits after the decimal point.",
        },
    )
    assert Tenant.objects.get(slug="acme").name == "Acme"
