"""REST: connectors and sources, whose credentials are write-only — accepted, never returned."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from commands.models import Command, Connector, Source
from commands.retry import Outlook
from commands.states import State


def never_shows(data, *secrets: str) -> None:
    text = json.dumps(data)
    for secret in secrets:
        assert secret not in text


def test_a_connectors_secret_is_accepted_and_never_returned(world, call):
    body = {"tenant": "acme", "name": "crm", "kind": "http", "url": "https://crm.example/hook",
            "secret_header": "Authorization", "secret": "Bearer top-secret-1"}  # fmt: skip
    status, created = call("admin", "POST", "/api/v1/connectors/", body)
    assert status == 201
    assert (created["secret_set"], "secret" in created) == (True, False)
    connector = Connector.objects.get(pk=created["id"])
    assert connector.secret == "Bearer top-secret-1"
    for caller in ("admin", "viewer", "tenant_a"):
        never_shows(call(caller, "GET", f"/api/v1/connectors/{connector.pk}/")[1], "top-secret-1")
        never_shows(call(caller, "GET", "/api/v1/connectors/")[1], "top-secret-1")


def test_a_patch_without_the_secret_keeps_it_and_an_empty_one_clears_it(world, call):
    connector = world.a.connector
    connector.secret = "Bearer kept"
    connector.save()
    status, data = call("operator", "PATCH", f"/api/v1/connectors/{connector.pk}/", {"idempotent": True})
    assert (status, data["secret_set"], data["idempotent"]) == (200, True, True)
    connector.refresh_from_db()
    assert connector.secret == "Bearer kept"
    status, data = call("operator", "PATCH", f"/api/v1/connectors/{connector.pk}/", {"secret": ""})
    assert (status, data["secret_set"]) == (200, False)


def test_saving_a_connector_queues_its_after_fix_commands(world, call):
    connector = world.a.connector
    Connector.objects.filter(pk=connector.pk).update(idempotent=True)
    waiting = Command.objects.create(
        tenant=world.a.tenant, connector=connector, state=State.FAILED, last_outlook=Outlook.AFTER_FIX,
        attempts=1, skip_reason="backing-off", next_attempt_at=timezone.now() + timedelta(minutes=9),
    )  # fmt: skip
    status, _ = call("operator", "PATCH", f"/api/v1/connectors/{connector.pk}/", {"secret": "Bearer fixed"})
    assert status == 200
    waiting.refresh_from_db()
    assert (waiting.state, waiting.skip_reason, waiting.attempts) == (State.QUEUED, "", 1)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"headers": {"Authorization": "Bearer x"}}, "headers"),
        ({"headers": {"X-A": "a\nb"}}, "headers"),
        ({"headers": ["not", "a", "dict"]}, "headers"),
        ({"status_map": {"999": "never"}}, "status_map"),
        ({"url": "ftp://example.com/"}, "url"),
        ({"kind": "carrier-pigeon"}, "kind"),
        ({"read_timeout_s": 1e300}, "read_timeout_s"),
        ({"read_timeout_s": 299, "connect_timeout_s": 5}, "non_field_errors"),
        ({"name": "spare"}, "non_field_errors"),
        ({"tenant": "globex"}, "tenant"),
        ({"secret_header": "Bad Header"}, "secret_header"),
        ({"secret": "Bearer x\r\nX-Evil: 1"}, "secret"),
        ({"secret": "\u20ac"}, "secret"),
        ({"headers": {"X-A": "a\u0001b"}}, "headers"),
        ({"url": "http://user:pw@127.0.0.1:1/x"}, "url"),
    ],
)
def test_a_bad_connector_is_a_400_naming_the_field(world, call, body, field):
    status, data = call("admin", "PATCH", f"/api/v1/connectors/{world.a.connector.pk}/", body)
    assert (status, data["error"]) == (400, "invalid"), data
    assert field in data["fields"]


def test_a_secret_that_is_no_header_value_is_refused_naming_the_field_never_quoting_it(world, call):
    body = {"tenant": "acme", "name": "h-sec", "kind": "http", "url": "http://127.0.0.1:1/",
            "secret_header": "Authorization", "secret": "Bearer topsecretvalue\r\nX-Evil: 1"}  # fmt: skip
    status, data = call("admin", "POST", "/api/v1/connectors/", body)
    assert (status, data["error"], data["fields"]) == (
        400,
        "invalid",
        {"secret": ["The secret must be on one line (no CR or LF)."]},
    )
    never_shows(data, "topsecretvalue")
    assert not Connector.objects.filter(name="h-sec").exists()


def test_a_url_with_credentials_is_refused_naming_the_field_never_quoting_it(world, call):
    body = {"tenant": "acme", "name": "h-url", "kind": "http", "url": "http://user:s3cretpw@127.0.0.1:1/x"}
    status, data = call("admin", "POST", "/api/v1/connectors/", body)
    assert (status, list(data["fields"])) == (400, ["url"])
    assert "secret header" in data["fields"]["url"][0]
    never_shows(data, "s3cretpw")
    assert not Connector.objects.filter(name="h-url").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/x", "http://127.0.0.1:0/x"])
def test_a_url_whose_port_no_connection_can_reach_is_refused(world, call, url):
    body = {"tenant": "acme", "name": "h-port", "kind": "http", "url": url}
    status, data = call("admin", "POST", "/api/v1/connectors/", body)
    assert (status, data["fields"]) == (400, {"url": ["The URL's port is not a port (1 to 65535)."]})


def test_a_number_too_large_for_a_float_is_a_400(world):
    client = world.client("admin")
    response = client.patch(
        f"/api/v1/connectors/{world.a.connector.pk}/",
        '{"read_timeout_s": 1e400}',
        content_type="application/json",
    )
    # Refused by the parser, as the intake refuses it: 1e400 reads as infinity, which no column holds.
    assert (response.status_code, response.json()) == (
        400,
        {"error": "parse_error", "detail": "The JSON holds a number too large to store."},
    )


def test_a_connector_with_commands_cannot_be_deleted(world, call):
    status, data = call("admin", "DELETE", f"/api/v1/connectors/{world.a.connector.pk}/")
    assert (status, data["error"]) == (409, "conflict")
    assert Connector.objects.filter(pk=world.a.connector.pk).exists()


def test_a_sources_signing_secrets_are_write_only_and_counted(world, call):
    source = world.a.source
    status, data = call("tenant_a", "GET", f"/api/v1/sources/{source.pk}/")
    assert (status, data["secrets_set"], data["connectors"]) == (200, 1, [world.a.connector.pk])
    never_shows(data, "s3cret")
    body = {"verifier_secrets": ["new-secret-2", "s3cret"], "connectors": [world.a.spare_connector.pk]}
    status, data = call("operator", "PATCH", f"/api/v1/sources/{source.pk}/", body)
    assert (status, data["secrets_set"], data["connectors"]) == (200, 2, [world.a.spare_connector.pk])
    never_shows(data, "new-secret-2", "s3cret")
    source.refresh_from_db()
    assert source.verifier_secrets == ["new-secret-2", "s3cret"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"connectors": ["{b_connector}"]}, "connectors"),
        ({"connectors": [2**63]}, "connectors"),
        ({"verifier": "telepathy"}, "verifier"),
        ({"verifier": "github", "verifier_secrets": []}, "verifier_secrets"),
        ({"dedupe_key": "json:"}, "dedupe_key"),
        ({"slug": "spare"}, "non_field_errors"),
    ],
)
def test_a_bad_source_is_a_400_naming_the_field(world, call, body, field):
    if body.get("connectors") == ["{b_connector}"]:
        body = {"connectors": [world.b.connector.pk]}
    status, data = call("admin", "PATCH", f"/api/v1/sources/{world.a.source.pk}/", body)
    assert (status, data["error"]) == (400, "invalid"), data
    assert field in data["fields"]
    assert list(Source.objects.get(pk=world.a.source.pk).connectors.all()) == [world.a.connector]


def test_a_source_is_created_for_the_tenant_it_names(world, call):
    body = {"tenant": "globex", "slug": "payments", "verifier": "stripe", "verifier_secrets": ["whsec_x"],
            "connectors": [world.b.connector.pk], "dedupe_key": "stripe"}  # fmt: skip
    status, data = call("admin", "POST", "/api/v1/sources/", body)
    assert status == 201, data
    assert (data["tenant"], data["secrets_set"], data["connectors"]) == ("globex", 1, [world.b.connector.pk])


def test_a_body_larger_than_the_site_reads_is_a_json_413(world, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = json.dumps({"tenant": "acme", "name": "big", "kind": "log", "url": "x" * 2000})
    response = world.client("admin").post("/api/v1/connectors/", body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"
    assert not Connector.objects.filter(name="big").exists()


def test_connectors_and_sources_filter_by_tenant_kind_and_enabled(world, call):
    status, data = call("viewer", "GET", "/api/v1/connectors/?tenant=globex&kind=log")
    assert (status, [row["id"] for row in data["results"]]) == (200, [world.b.spare_connector.pk])
    status, data = call("viewer", "GET", "/api/v1/sources/?tenant=acme")
    assert sorted(row["slug"] for row in data["results"]) == ["orders", "spare"]
    status, data = call("viewer", "GET", "/api/v1/connectors/?kind=telegraph")
    assert (status, data["error"]) == (400, "invalid")


@pytest.mark.parametrize(
    ("path", "body", "fields"),
    [
        ("connectors", {"idempotnet": True}, {"idempotnet": ["Unknown field."]}),
        ("connectors", {"read_timeout_s": True}, {"read_timeout_s": ["A valid number is required."]}),
        ("sources", {"need_approval": True}, {"need_approval": ["Unknown field."]}),
    ],
)
def test_a_field_a_connector_or_source_does_not_have_is_a_400_not_ignored(world, call, path, body, fields):
    row = world.a.connector if path == "connectors" else world.a.source
    before = call("admin", "GET", f"/api/v1/{path}/{row.pk}/")[1]
    status, data = call("admin", "PATCH", f"/api/v1/{path}/{row.pk}/", body)
    assert (status, data["error"], data["fields"]) == (400, "invalid", fields)
    assert call("admin", "GET", f"/api/v1/{path}/{row.pk}/")[1] == before


def test_a_connector_read_and_sent_back_whole_is_accepted(world, call):
    path = f"/api/v1/connectors/{world.a.connector.pk}/"
    read = call("admin", "GET", path)[1]
    status, data = call("admin", "PUT", path, {**read, "name": "renamed"})
    assert (status, data["name"]) == (200, "renamed"), data
