"""Untimestamped schemes (GitHub, Shopify sign the body alone): a source that dedupes bodies answers
a body accepted within the claim TTL as a duplicate, whatever delivery id it is re-sent under."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from commands.intake.signatures import build_verifier
from commands.models import Delivery, Source
from tests.commands.conftest import HOOK_SECRET

NOW = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)
BODY = b'{"action": "opened", "number": 7}'


@pytest.fixture
def github_source(tenant, make_connector):
    """``acme/gh``: GitHub-signed, deduped on X-GitHub-Delivery, its body dedupe left to the default."""
    source = Source.objects.create(
        tenant=tenant, slug="gh", verifier="github", verifier_secrets=[HOOK_SECRET], dedupe_key="github"
    )
    source.connectors.set([make_connector("log", kind="log")])
    return source


def answer(response) -> tuple[int, dict]:
    return response.status_code, json.loads(response.content)


@pytest.mark.parametrize(
    ("verifier", "secrets", "on"),
    [("github", ["s"], True), ("shopify", ["s"], True), ("stripe", ["s"], False), ("none", [], False)],
)
def test_new_github_and_shopify_sources_dedupe_bodies_by_default(tenant, verifier, secrets, on):
    source = Source.objects.create(tenant=tenant, slug="s", verifier=verifier, verifier_secrets=secrets)
    source.refresh_from_db()
    assert source.dedupe_body is on


def test_a_source_created_with_body_dedupe_off_keeps_it_off_and_may_turn_it_on(tenant):
    source = Source.objects.create(
        tenant=tenant, slug="s", verifier="github", verifier_secrets=["s"], dedupe_body=False
    )
    source.refresh_from_db()
    assert source.dedupe_body is False
    source.dedupe_body = True
    source.save()
    source.refresh_from_db()
    assert source.dedupe_body is True


@pytest.mark.parametrize(("chosen", "stored"), [("unknown", True), ("false", False)])
def test_the_admin_adds_a_github_source_deduping_bodies_unless_told_otherwise(
    admin_client, tenant, chosen, stored
):
    page = admin_client.get("/admin/commands/source/add/").content.decode()
    assert '<option value="unknown" selected>By verifier: on for GitHub and Shopify</option>' in page
    data = {"tenant": tenant.pk, "slug": "gh", "verifier": "github", "verifier_secrets": "s", "verifier_options": "{}",
            "dedupe_key": "github", "dedupe_body": chosen}  # fmt: skip
    assert admin_client.post("/admin/commands/source/add/", data).status_code == 302
    assert Source.objects.get(slug="gh").dedupe_body is stored


def test_the_api_creates_a_github_source_deduping_bodies_unless_told_otherwise(world, call):
    body = {"tenant": "acme", "slug": "gh", "verifier": "github", "verifier_secrets": ["s"]}
    status, created = call("admin", "POST", "/api/v1/sources/", body)
    assert (status, created["dedupe_body"]) == (201, True)
    status, created = call("admin", "POST", "/api/v1/sources/", {**body, "slug": "gh2", "dedupe_body": False})
    assert (status, created["dedupe_body"]) == (201, False)


def test_a_captured_body_re_sent_under_a_new_delivery_id_is_a_duplicate_of_the_original(
    github_source, post_hook
):
    first = post_hook(BODY, delivery="d-1", path="/hooks/acme/gh/")
    assert first.status_code == 202
    original = json.loads(first.content)["id"]
    assert answer(post_hook(BODY, delivery="d-2", path="/hooks/acme/gh/")) == (
        200,
        {"status": "duplicate", "id": original},
    )
    assert answer(post_hook(BODY, delivery="d-1", path="/hooks/acme/gh/")) == (
        200,
        {"status": "duplicate", "id": original},
    )
    assert (
        post_hook(b'{"action": "closed", "number": 7}', delivery="d-3", path="/hooks/acme/gh/").status_code
        == 202
    )
    assert list(Delivery.objects.order_by("pk").values_list("event_key", flat=True)) == ["d-1", "d-3"]


def test_the_same_body_is_accepted_again_once_the_claim_ttl_has_passed(github_source, post_hook):
    with time_machine.travel(NOW, tick=False):
        assert post_hook(BODY, delivery="d-1", path="/hooks/acme/gh/").status_code == 202
    later = NOW + timedelta(milliseconds=settings.ANKUSA_CLAIM_TTL_MS + 1000)
    with time_machine.travel(later, tick=False):
        assert post_hook(BODY, delivery="d-2", path="/hooks/acme/gh/").status_code == 202
    assert Delivery.objects.count() == 2


def test_a_source_with_body_dedupe_off_stores_one_body_under_each_id(hook_source, post_hook):
    assert [post_hook(BODY, delivery=d).status_code for d in ("d-1", "d-2")] == [202, 202]
    assert post_hook(BODY, delivery="d-1").status_code == 200  # the delivery id still dedupes


def test_a_shopify_body_re_sent_under_a_new_webhook_id_is_a_duplicate(tenant, make_connector, client):
    source = Source.objects.create(
        tenant=tenant, slug="shop", verifier="shopify", verifier_secrets=[HOOK_SECRET], dedupe_key="shopify"
    )
    source.connectors.set([make_connector("log", kind="log")])
    signed = build_verifier("shopify", [HOOK_SECRET]).sign(BODY, time.time())

    def post(webhook_id: str):
        headers = {**signed, "X-Shopify-Webhook-Id": webhook_id}
        return client.post("/hooks/acme/shop/", BODY, content_type="application/json", headers=headers)

    first = post("w-1")
    assert first.status_code == 202
    assert answer(post("w-2")) == (200, {"status": "duplicate", "id": json.loads(first.content)["id"]})


@pytest.mark.django_db(transaction=True)
def test_existing_sources_keep_their_behaviour_after_the_migration():
    before = ("commands", "0008_mask_secrets_in_answers")
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("commands")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    try:
        apps = executor.loader.project_state([before]).apps
        tenant = apps.get_model("limits", "Tenant").objects.create(slug="acme", name="Acme")
        old = apps.get_model("commands", "Source").objects.create(
            tenant=tenant, slug="gh", verifier="github", verifier_secrets=["s"], verifier_options={}
        )
    finally:
        MigrationExecutor(connection).migrate(latest)
    assert Source.objects.get(pk=old.pk).dedupe_body is False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_nodes_sharing_redis_store_one_body_sent_under_30_ids_at_once(
    hook_source, start_node, redis_client
):
    Source.objects.filter(pk=hook_source.pk).update(dedupe_body=True)
    fleet = {"ANKUSA_STORE_SCOPE": "fleet", "ANKUSA_STORE_TIMEOUT_MS": "500"}
    nodes = [start_node(**fleet), start_node(**fleet)]
    barrier = threading.Barrier(30)

    def send(n: int):
        barrier.wait()
        return nodes[n % 2].hook(f"replay-{n}", BODY)

    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(send, range(30)))

    delivery = Delivery.objects.get()
    statuses = Counter(status for status, _, _ in answers)
    assert statuses[202] == 1, statuses
    assert set(statuses) <= {202, 409, 200}, statuses
    assert all(data["id"] == delivery.pk for status, data, _ in answers if status in (200, 202))
    assert [node.hook("replay-late", BODY)[:2] for node in nodes] == [
        (200, {"status": "duplicate", "id": delivery.pk})
    ] * 2
