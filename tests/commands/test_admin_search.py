"""Search that finds things: a connector's name, a tenant's slug, text in the payload (an order
number), on both command lists — and on PostgreSQL through the payload's trigram index."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.urls import reverse

from commands.models import Command, Connector
from commands.staff import search
from limits.models import Tenant
from tests.commands.staff import make_failed

LISTS = ["command", "failedcommand"]


@pytest.fixture
def staff(admin_client):
    return admin_client


def found(client, model: str, q: str) -> set[int]:
    response = client.get(reverse(f"admin:commands_{model}_changelist"), {"q": q})
    assert response.status_code == 200
    return set(map(int, re.findall(r'name="_selected_action" value="(\d+)"', response.content.decode())))


@pytest.fixture
def world(db, tenant):
    globex = Tenant.objects.create(slug="globex", name="Globex")
    crm = Connector.objects.create(tenant=tenant, name="crm-orders", kind="http", url="http://127.0.0.1:9/")
    ledger = Connector.objects.create(tenant=globex, name="ledger", kind="http", url="http://127.0.0.1:9/")
    return {
        "order": make_failed(crm, payload={"order": "INV-20931", "lines": 3}),
        "other": make_failed(crm, payload={"order": "INV-11111"}),
        "globex": make_failed(ledger, payload={"entry": "E-7"}, idempotency_key="evt_42"),
    }


@pytest.mark.parametrize("model", LISTS)
def test_text_in_the_payload_finds_its_command_in_any_case(staff, world, model):
    assert found(staff, model, "inv-20931") == {world["order"].pk}


@pytest.mark.parametrize("model", LISTS)
def test_a_connectors_name_and_a_tenants_slug_find_their_commands(staff, world, model):
    assert found(staff, model, "crm-ord") == {world["order"].pk, world["other"].pk}
    assert found(staff, model, "globex") == {world["globex"].pk}


@pytest.mark.parametrize("model", LISTS)
def test_every_word_must_match(staff, world, model):
    assert found(staff, model, "crm INV-2") == {world["order"].pk}
    assert found(staff, model, "globex INV-2") == set()


def test_a_bare_number_is_an_id_and_a_quoted_one_is_text(staff, world):
    order = world["order"]
    assert found(staff, "command", str(order.pk)) == {order.pk}
    # 20931 is no id here; quoted, it is searched in the payloads.
    assert found(staff, "command", "20931") == set()
    assert found(staff, "command", '"20931"') == {order.pk}


def test_an_idempotency_key_is_found_exactly(staff, world):
    Command.objects.filter(pk=world["globex"].pk).update(source=None)
    assert found(staff, "command", "evt_42") == {world["globex"].pk}
    assert found(staff, "command", "evt_4") == set()


def test_a_huge_term_is_an_answer_not_an_error(staff, world):
    assert found(staff, "command", "x" * 5000) == set()


def test_sqlite_scans_the_newest_commands_only(staff, world, monkeypatch):
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL searches every payload through its index")
    monkeypatch.setattr(search, "SQLITE_PAYLOAD_SCAN", 1)  # the newest command only
    assert found(staff, "command", "INV-20931") == set()
    assert found(staff, "command", "E-7") == {world["globex"].pk}


def test_postgresql_reads_the_payload_through_its_trigram_index(world):
    if connection.vendor != "postgresql":
        pytest.skip("the trigram index exists on PostgreSQL only")
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'commands_payload_trgm_idx'")
        (definition,) = cursor.fetchone()
        assert "gin" in definition and "gin_trgm_ops" in definition
        cursor.execute("SET enable_seqscan = off")  # a handful of rows: ask whether the index can serve
        try:
            query = Command.objects.filter(search.payload_contains("INV-20931")).only("pk")
            sql, params = query.query.sql_with_params()
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("SET enable_seqscan = on")
    assert "commands_payload_trgm_idx" in plan
