"""REST: the command list (filters, cursor pages, its cost), a command's detail with its attempts,
deliveries and audit entries; hostile query input is a 4xx JSON error, never a 500."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from commands.models import Attempt, Command
from commands.retry import Outlook
from commands.states import State


def failed_commands(world, n: int) -> None:
    Command.objects.bulk_create(
        Command(
            tenant=world.a.tenant,
            connector=world.a.connector,
            payload={"n": i},
            state=State.FAILED,
            last_outlook=Outlook.AFTER_FIX,
            skip_reason="backing-off",
            attempts=2,
        )
        for i in range(n)
    )


def test_the_failed_list_explains_why_each_command_waits(world, call):
    failed_commands(world, 1)
    status, data = call("viewer", "GET", "/api/v1/commands/?state=failed&last_outlook=after-fix")
    assert status == 200
    [row] = data["results"]
    assert (row["state"], row["skip_reason"], row["tenant"], row["connector_name"]) == (
        "failed", "backing-off", "acme", "billing",
    )  # fmt: skip
    assert (
        row["skip_explanation"]
        == "the receiver asks for a configuration fix — checked again at the next round"
    )
    assert row["why"]["key"] == "after-fix" and row["why"]["by"] == "machine"
    assert "payload" not in row


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=failed", {"acme-never", "globex-never"}),
        ("skip_reason=never&tenant=acme", {"acme-never"}),
        ("last_outlook=never&tenant=globex", {"globex-never"}),
        ("state=draft", set()),
    ],
)
def test_the_list_filters_by_state_reason_outlook_tenant_and_connector(world, call, query, expected):
    status, data = call("admin", "GET", f"/api/v1/commands/?{query}")
    assert status == 200
    assert {f"{row['tenant']}-{row['skip_reason']}" for row in data["results"]} == expected


def test_the_connector_filter(world, call):
    status, data = call("admin", "GET", f"/api/v1/commands/?connector={world.b.connector.pk}")
    assert [row["id"] for row in data["results"]] == [world.b.command.pk]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=lost", "state"),
        ("skip_reason=%00", "skip_reason"),
        ("last_outlook=maybe", "last_outlook"),
        ("connector=" + "x" * 101, "connector"),
        ("connector=a%00b", "connector"),
        ("tenant=" + "x" * 65, "tenant"),
        ("tenant=a%00b", "tenant"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(world, call, query, field):
    status, data = call("admin", "GET", f"/api/v1/commands/?{query}")
    assert (status, data["error"]) == (400, "invalid")
    assert field in data["fields"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/commands/9223372036854775807/",
        "/api/v1/commands/9223372036854775808/",
        "/api/v1/commands/99999999999999999999999/",
        "/api/v1/commands/abc/",
        "/api/v1/commands/-1/",
        "/api/v1/connectors/9223372036854775808/",
        "/api/v1/deliveries/9999999999999999999/",
        "/api/v1/audit-entries/9999999999999999999/",
        "/api/v1/commands/9999999999999999999/attempts/",
        "/api/v1/commands/?cursor=bogus",
    ],
)
def test_a_missing_huge_or_malformed_id_is_a_json_404(world, call, path):
    status, data = call("admin", "GET", path)
    assert (status, data["error"]) == (404, "not_found")


def test_the_list_is_cursor_paged_newest_first(world, call):
    failed_commands(world, 60)
    status, first = call("admin", "GET", "/api/v1/commands/?tenant=acme")
    assert (status, len(first["results"])) == (200, 50)
    assert "count" not in first
    ids = [row["id"] for row in first["results"]]
    assert ids == sorted(ids, reverse=True)
    status, second = call("admin", "GET", first["next"])
    assert len(second["results"]) == 11
    assert second["next"] is None


def test_a_commands_detail_has_its_payload_attempts_and_links(world, call):
    command = world.a.command
    status, data = call("tenant_a", "GET", f"/api/v1/commands/{command.pk}/")
    assert status == 200
    assert data["payload"] == {"order": 1}
    assert [(a["number"], a["ok"], a["outlook"]) for a in data["latest_attempts"]] == [(1, False, "never")]
    assert data["links"]["attempts"].endswith(f"/api/v1/commands/{command.pk}/attempts/")
    assert (data["resent_from"], data["resent_as"], data["links"]["resent_from"]) == (None, [], None)


def test_the_attempt_history_is_cursor_paged_newest_first(world, call):
    command = world.a.command
    Attempt.objects.bulk_create(
        Attempt(command=command, number=n, started_at=command.created_at, ok=False) for n in range(2, 61)
    )
    status, data = call("tenant_a", "GET", f"/api/v1/commands/{command.pk}/attempts/")
    assert status == 200
    assert [a["number"] for a in data["results"]] == list(range(60, 10, -1))
    status, detail = call("tenant_a", "GET", f"/api/v1/commands/{command.pk}/")
    assert [a["number"] for a in detail["latest_attempts"]] == list(range(41, 61))


def test_a_commands_detail_reads_its_resent_copies_once_and_a_list_never_reads_payloads(world, call):
    original = world.a.command
    copies = [
        Command.objects.create(
            tenant=original.tenant, connector=original.connector, payload={}, resent_from=original
        )
        for _ in range(3)
    ]
    with CaptureQueriesContext(connection) as detail:
        status, data = call("viewer", "GET", f"/api/v1/commands/{original.pk}/")
    assert status == 200
    assert data["resent_as"] == sorted(copy.pk for copy in copies)
    assert len(data["links"]["resent_as"]) == 3
    reads_copies = [
        q for q in detail if '"resent_from_id" IN' in q["sql"] or '"resent_from_id" =' in q["sql"]
    ]
    assert len(reads_copies) == 1
    with CaptureQueriesContext(connection) as listing:
        assert call("viewer", "GET", "/api/v1/commands/")[0] == 200
    assert not any('"payload"' in query["sql"] for query in listing)


def count_queries(call, path: str) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as queries:
        status, data = call("viewer", "GET", path)
    assert status == 200
    return len(queries), len(data["results"])


def test_the_failed_list_costs_the_same_queries_for_10_and_1000_commands(world, call):
    failed_commands(world, 9)
    small = count_queries(call, "/api/v1/commands/?state=failed")
    failed_commands(world, 990)
    large = count_queries(call, "/api/v1/commands/?state=failed")
    assert (small[1], large[1]) == (11, 50)
    assert small[0] == large[0]


def test_a_delivery_shows_its_body_and_never_a_signature_header(world, call):
    delivery = world.a.delivery
    status, data = call("tenant_a", "GET", f"/api/v1/deliveries/{delivery.pk}/")
    assert status == 200
    assert data["body"] == '{"order": 1}'
    assert data["headers"] == {"Content-Type": "application/json"}
    assert data["commands"] == [world.a.command.pk]
    status, listed = call("tenant_a", "GET", "/api/v1/deliveries/")
    assert [row["id"] for row in listed["results"]] == [delivery.pk]
    assert "body" not in listed["results"][0]
    assert "X-Hub-Signature-256" not in listed["results"][0]["headers"]


def test_the_audit_list_filters_by_command(world, call):
    status, data = call("viewer", "GET", f"/api/v1/audit-entries/?command={world.a.command.pk}")
    assert (status, [row["id"] for row in data["results"]]) == (200, [world.audit.pk])
    status, data = call("viewer", "GET", f"/api/v1/audit-entries/?command={world.b.command.pk}")
    assert (status, data["results"]) == (200, [])
    status, data = call("viewer", "GET", "/api/v1/audit-entries/?action=explode")
    assert (status, data["error"]) == (400, "invalid")
