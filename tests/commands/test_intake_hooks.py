"""``POST /hooks/<tenant>/<source>/`` through the whole site: stored once, refused in order, never a
2xx for something not stored."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone
from prometheus_client import REGISTRY

from commands.dispatch.sweep import sweep
from commands.intake import hooks
from commands.lifecycle import QUEUE_NAME
from commands.models import Command, Delivery, Source
from commands.states import State
from limits import admission
from limits.models import Tenant
from limits.store import Ok, forget_store
from queues.backends import get_queue
from tests.commands.conftest import HOOK_SECRET

NOW = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)


def answer(response) -> tuple[int, dict]:
    return response.status_code, json.loads(response.content)


def queued_payloads() -> list[dict]:
    queue = get_queue(QUEUE_NAME)
    return [item.payload for item in queue.peek("main", 100)]


def test_a_signed_webhook_is_stored_once_with_a_queued_command_per_connector(hook_source, post_hook):
    with time_machine.travel(NOW, tick=False):
        response = post_hook(
            b'{"order": "A-1"}', "evt-1", headers={"X-GitHub-Event": "push", "User-Agent": "GitHub"}
        )
    delivery = Delivery.objects.get()
    commands = list(Command.objects.order_by("connector__name"))
    assert answer(response) == (
        202,
        {"status": "accepted", "id": delivery.pk, "commands": sorted(c.pk for c in commands)},
    )
    assert (delivery.tenant, delivery.source, delivery.event_key) == (
        hook_source.tenant,
        hook_source,
        "evt-1",
    )
    assert (delivery.body, delivery.size, delivery.received_at) == ('{"order": "A-1"}', 16, NOW)
    assert delivery.headers == {
        "Content-Type": "application/json",
        "User-Agent": "GitHub",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": "evt-1",
    }
    assert [(c.connector.name, c.state, c.payload, c.delivery_id, c.idempotency_key) for c in commands] == [
        ("http", State.QUEUED, {"order": "A-1"}, delivery.pk, "evt-1"),
        ("log", State.QUEUED, {"order": "A-1"}, delivery.pk, "evt-1"),
    ]
    assert sorted(queued_payloads(), key=lambda p: p["command"]) == [
        {"command": c.pk, "attempt": 1} for c in sorted(commands, key=lambda c: c.pk)
    ]


@pytest.fixture
def redis_queue(settings, redis_client):
    settings.ANKUSA_QUEUE_BACKEND = "redis"
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    return queue


@pytest.mark.django_db(transaction=True)  # the items are written on commit
def test_on_the_redis_queue_a_webhooks_items_follow_the_commit_of_its_rows(
    hook_source, post_hook, redis_queue
):
    status, body = answer(post_hook(delivery="evt-1"))
    commands = list(Command.objects.order_by("pk"))
    assert (status, body["commands"]) == (202, [c.pk for c in commands])
    assert {c.state for c in commands} == {State.QUEUED}
    assert [item.payload for item in redis_queue.peek("main", 10)] == [
        {"command": c.pk, "attempt": 1} for c in commands
    ]


@pytest.mark.django_db(transaction=True)  # the items are written on commit
@pytest.mark.fast_path  # the ORM's write is a transaction of several statements
def test_on_postgresql_with_the_redis_queue_a_webhooks_rows_are_one_statement(
    postgres, hook_source, post_hook, redis_queue, django_assert_num_queries
):
    assert post_hook(delivery="evt-1").status_code == 202  # reads and keeps the source's configuration
    with django_assert_num_queries(1):
        assert post_hook(delivery="evt-2").status_code == 202
    assert redis_queue.length("main") == 4


@pytest.mark.django_db(transaction=True)  # the items are written on commit
def test_a_redis_queue_down_after_the_commit_answers_202_and_leaves_the_commands_queued_for_recovery(
    hook_source, post_hook, redis_queue, monkeypatch, caplog
):
    import redis
    from django.conf import settings

    from commands.dispatch.recovery import recover
    from commands.intake import write
    from queues.backends.redis import RedisFIFO
    from tests.servers import free_port

    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2)  # nothing listens
    monkeypatch.setattr(write, "commands_queue", lambda: RedisFIFO(QUEUE_NAME, client=down))
    with caplog.at_level(logging.WARNING, logger="ankusa.intake"):
        status, body = answer(post_hook(delivery="evt-1"))
    commands = list(Command.objects.order_by("pk"))
    assert (status, body["commands"]) == (202, [c.pk for c in commands])
    assert {c.state for c in commands} == {State.QUEUED}
    assert redis_queue.length("main") == 0
    assert "intake_enqueue_failed" in caplog.text
    assert post_hook(delivery="evt-1").status_code == 200  # stored: the retry is a duplicate
    # The loop's recovery gives each its item, once the command is older than the visibility timeout.
    later = timezone.now() + timedelta(seconds=settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S + 1)
    assert recover(later, queue=redis_queue).lost_requeued == 2
    assert sorted(item.payload["command"] for item in redis_queue.peek("main", 10)) == [
        c.pk for c in commands
    ]


def test_a_command_born_at_intake_is_exactly_what_the_sweep_makes_of_an_approved_one(
    hook_source, post_hook, make_command
):
    connector = hook_source.connectors.get(name="http")
    swept = make_command(connector, {"order": "A-1"}, created_at=NOW)
    with time_machine.travel(NOW, tick=False):
        sweep(NOW)
        post_hook(b'{"order": "A-1"}', "evt-1")
    born = Command.objects.get(delivery__isnull=False, connector=connector)
    fields = ["state", "state_changed_at", "attempts", "next_attempt_at", "skip_reason", "skip_decided_at"]
    swept.refresh_from_db()
    assert [getattr(born, f) for f in fields] == [getattr(swept, f) for f in fields]
    assert {"command": born.pk, "attempt": 1} in queued_payloads()
    assert {"command": swept.pk, "attempt": 1} in queued_payloads()


def test_every_column_intake_does_not_set_holds_the_models_own_default(hook_source, post_hook):
    with time_machine.travel(NOW, tick=False):
        post_hook(b'{"order": "A-1"}', "evt-1")
    set_by_intake = {"tenant_id", "connector_id", "source_id", "delivery_id", "idempotency_key", "payload"}
    set_by_intake |= {"state", "state_changed_at", "next_attempt_at", "skip_reason", "skip_decided_at"}
    set_by_intake |= {"created_at"}
    fresh = Command()
    for stored in Command.objects.all():
        assert {
            f.attname: getattr(stored, f.attname)
            for f in Command._meta.concrete_fields
            if not f.primary_key and f.attname not in set_by_intake
        } == {
            f.attname: getattr(fresh, f.attname)
            for f in Command._meta.concrete_fields
            if not f.primary_key and f.attname not in set_by_intake
        }


@pytest.mark.fast_path  # the one-statement write hands jsonb the text; the ORM hands it a parse
def test_on_postgresql_a_webhooks_commands_hold_the_json_the_provider_sent(postgres, hook_source, post_hook):
    body = b'{"n": 1e2, "text": "caf\\u00e9 \\"quoted\\"", "list": [1, 2.50]}'
    assert post_hook(body, "evt-1").status_code == 202
    assert Delivery.objects.get().body == body.decode()
    # jsonb reads the text as sent: 1e2 is the number 100 (Python's parser would have made 100.0).
    payloads = [c.payload for c in Command.objects.all()]
    assert payloads == [{"n": 100, "list": [1, 2.5], "text": 'café "quoted"'}] * 2
    assert [type(p["n"]) for p in payloads] == [int, int]


def test_a_source_that_needs_approval_stores_drafts_and_queues_nothing(hook_source, post_hook):
    Source.objects.filter(pk=hook_source.pk).update(needs_approval=True)
    assert post_hook().status_code == 202
    assert set(Command.objects.values_list("state", flat=True)) == {State.DRAFT}
    assert queued_payloads() == []


def test_the_same_event_again_answers_200_with_the_original_delivery_and_stores_nothing(
    hook_source, post_hook
):
    first = post_hook(b'{"order": "A-1"}', "evt-1")
    again = post_hook(b'{"order": "A-1"}', "evt-1")
    original = Delivery.objects.get()
    assert first.status_code == 202
    assert answer(again) == (200, {"status": "duplicate", "id": original.pk})
    assert (Delivery.objects.count(), Command.objects.count(), len(queued_payloads())) == (1, 2, 2)


def test_the_database_refuses_a_duplicate_the_claim_store_never_saw(hook_source, post_hook):
    assert post_hook(delivery="evt-1").status_code == 202
    forget_store()  # another node, or a Redis outage: a store that never saw the claim
    again = post_hook(delivery="evt-1")
    assert answer(again) == (200, {"status": "duplicate", "id": Delivery.objects.get().pk})
    assert Command.objects.count() == 2
    # The store now knows the key as committed: the next duplicate is answered without an insert.
    assert answer(post_hook(delivery="evt-1"))[0] == 200


def test_a_key_claimed_by_a_holder_that_has_not_committed_is_409_in_flight(hook_source, post_hook):
    with time_machine.travel(NOW, tick=False):
        holder = admission.new_claim(
            hook_source.tenant, str(hook_source.pk), "evt-1", "pending", pending_ttl_ms=4500
        )
        assert isinstance(admission.admit(hook_source.tenant, 10, holder).result, Ok)
        refused = post_hook(delivery="evt-1")
    assert answer(refused) == (
        409,
        {
            "error": "in_flight",
            "detail": "Another request with this key is being stored; retry after the time in Retry-After.",
        },
    )
    assert refused["Retry-After"] == "5"
    assert Delivery.objects.count() == 0
    # The holder's commit failed: it releases the claim, and the provider's retry is accepted.
    admission.settle(holder, committed=False)
    assert post_hook(delivery="evt-1").status_code == 202


def test_a_bad_signature_is_401_stores_nothing_and_spends_no_quota(hook_source, post_hook):
    Tenant.objects.filter(pk=hook_source.tenant_id).update(hooks_rate=0.001, hooks_burst=1)
    refused = post_hook(delivery="evt-1", secret="not-the-secret")
    assert answer(refused) == (
        401,
        {"error": "bad_signature", "detail": "Signature refused: signature does not match."},
    )
    assert Delivery.objects.count() == 0
    assert post_hook(delivery="evt-1").status_code == 202  # the burst of one was still there


def test_a_rotated_secret_list_accepts_the_old_and_the_new_secret(hook_source, post_hook):
    Source.objects.filter(pk=hook_source.pk).update(verifier_secrets=["new-secret", HOOK_SECRET])
    assert post_hook(delivery="old", secret=HOOK_SECRET).status_code == 202
    assert post_hook(delivery="new", secret="new-secret").status_code == 202
    assert post_hook(delivery="other", secret="other").status_code == 401


def test_over_the_quota_is_429_with_retry_after_in_whole_seconds_and_ratelimit_headers(
    hook_source, post_hook
):
    Tenant.objects.filter(pk=hook_source.tenant_id).update(hooks_rate=0.4, hooks_burst=1)
    with time_machine.travel(NOW, tick=False):
        accepted = post_hook(delivery="evt-1")
        limited = post_hook(delivery="evt-2")
    assert accepted.status_code == 202
    assert (accepted["RateLimit-Policy"], accepted["RateLimit"]) == ('"hooks";q=1;w=3', '"hooks";r=0;t=3')
    assert answer(limited) == (
        429,
        {
            "error": "rate_limited",
            "detail": "The tenant's quota is spent; retry after the time in Retry-After.",
        },
    )
    assert (limited["Retry-After"], limited["RateLimit"]) == ("3", '"hooks";r=0;t=3')  # 2.5 s, rounded up
    assert Delivery.objects.count() == 1


def test_a_content_length_over_the_tenants_limit_is_413_without_reading_the_body(hook_source, post_hook):
    Tenant.objects.filter(pk=hook_source.tenant_id).update(max_body_bytes=100)
    # The body is small; only the declared length is over the limit: the answer comes from it alone.
    refused = post_hook(b'{"order": 1}', CONTENT_LENGTH="101")
    assert answer(refused) == (
        413,
        {"error": "too_large", "detail": "The body is larger than this tenant's 100 bytes."},
    )
    exactly = b'{"order": "' + b"x" * 87 + b'"}'
    assert (len(exactly), post_hook(exactly).status_code) == (100, 202)


def test_a_body_larger_than_the_bytes_burst_is_413_and_never_retry(hook_source, post_hook):
    Tenant.objects.filter(pk=hook_source.tenant_id).update(bytes_rate=10, bytes_burst=20)
    refused = post_hook(b'{"order": "0123456789abcdef"}')
    assert answer(refused) == (
        413,
        {"error": "too_large", "detail": "The body can never pass the tenant's bytes limit."},
    )
    assert "Retry-After" not in refused
    assert Delivery.objects.count() == 0


def test_a_source_that_dedupes_refuses_a_webhook_without_the_event_id(hook_source, post_hook):
    Tenant.objects.filter(pk=hook_source.tenant_id).update(hooks_rate=0.001, hooks_burst=1)
    refused = post_hook(delivery=None)
    assert answer(refused) == (400, {"error": "missing_event_key", "detail": "No event id at github."})
    assert post_hook(delivery="evt-1").status_code == 202  # no quota spent by the refusal


def test_a_source_without_dedupe_stores_every_webhook(hook_source, post_hook):
    Source.objects.filter(pk=hook_source.pk).update(dedupe_key="")
    assert [post_hook(delivery="same").status_code for _ in range(2)] == [202, 202]
    assert list(Delivery.objects.values_list("event_key", flat=True)) == ["", ""]


def test_a_json_path_event_key_longer_than_200_bytes_is_kept_as_its_sha256(hook_source, post_hook):
    Source.objects.filter(pk=hook_source.pk).update(dedupe_key="json:data.id")
    body = json.dumps({"data": {"id": "é" * 150}}).encode()
    assert post_hook(body, delivery=None).status_code == 202
    assert post_hook(body, delivery=None).status_code == 200
    assert Delivery.objects.get().event_key.startswith("sha256:")


@pytest.mark.parametrize(
    "path",
    [
        "/hooks/nobody/orders/",
        "/hooks/acme/nothing/",
        "/hooks/acme/orders/extra/",
        "/hooks/..%2F..%2Fadmin/orders/",
        "/hooks/acme/%2e%2e/",
        "/hooks/acme%00/orders/",
        "/hooks/acme%0A/orders/",
        "/hooks/" + "a" * 5000 + "/orders/",
    ],
)
def test_unknown_tenants_sources_and_hostile_slugs_are_404_json(hook_source, post_hook, path):
    status, data = answer(post_hook(path=path))
    assert (status, data["error"]) == (404, "not_found")
    assert Delivery.objects.count() == 0


def test_an_inactive_tenant_is_404_like_an_unknown_one(hook_source, post_hook):
    Tenant.objects.filter(pk=hook_source.tenant_id).update(active=False)
    assert answer(post_hook()) == (404, {"error": "not_found", "detail": "No such tenant or source."})


def test_the_trailing_slash_is_optional(hook_source, post_hook):
    assert post_hook(path="/hooks/acme/orders").status_code == 202


@pytest.mark.parametrize("method", ["get", "put", "patch", "delete", "head", "options"])
def test_other_methods_are_405_json_naming_post(hook_source, client, method):
    response = getattr(client, method)("/hooks/acme/orders/")
    assert (response.status_code, response["Allow"]) == (405, "POST")
    if method != "head":
        assert json.loads(response.content)["error"] == "method_not_allowed"


@pytest.mark.parametrize("body", [b"null", b"[]", b"0", b'"text"', b'{"n": 1e-16383, "m": 0.5}'])
def test_any_storable_json_a_provider_sends_is_stored_as_sent_on_either_database(
    hook_source, post_hook, body
):
    assert post_hook(body, "evt-1").status_code == 202
    delivery = Delivery.objects.get()
    assert delivery.body == body.decode()
    assert [command.payload for command in Command.objects.all()] == [json.loads(body)] * 2


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "bad_json"),
        (b"not json", "bad_json"),
        (b'{"order": 1', "bad_json"),
        (b'\xff\xfe{"order": 1}', "bad_encoding"),
        (b'{"order": "\xc3\x28"}', "bad_encoding"),
        (b"\xef\xbb\xbf{}", "bad_json"),  # a UTF-8 byte order mark
        (b'{"order": "\\u0000"}', "bad_json"),  # PostgreSQL cannot store NUL
        (b'{"\\ud800": 1}', "bad_json"),  # nor a lone surrogate
        (b'{"n": NaN}', "bad_json"),
        (b'{"n": 1e999}', "bad_json"),
        (b'{"n": 1e-16384}', "bad_json"),  # more digits after the point than PostgreSQL keeps
        (b"[" * 100_000 + b"]" * 100_000, "bad_json"),
        (b'{"a":' * 70 + b"1" + b"}" * 70, "bad_json"),
    ],
)
def test_hostile_bodies_are_400_json_and_store_nothing(hook_source, post_hook, body, code):
    status, data = answer(post_hook(body))
    assert (status, data["error"]) == (400, code)
    assert Delivery.objects.count() == Command.objects.count() == 0


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Hub-Signature-256": "sha256=" + "ab" * 4000},
        {"X-Hub-Signature-256": "sha256=zz"},
        {"X-Hub-Signature-256": "md5=00"},
        {"X-Hub-Signature-256": ""},
    ],
)
def test_huge_or_malformed_signature_headers_are_401(hook_source, post_hook, headers):
    status, data = answer(post_hook(headers=headers))
    assert (status, data["error"]) == (401, "bad_signature")
    assert Delivery.objects.count() == 0


def test_a_huge_event_id_header_is_stored_as_its_sha256(hook_source, post_hook):
    assert post_hook(delivery="x" * 8000).status_code == 202
    assert Delivery.objects.get().event_key.startswith("sha256:")


def test_a_replayed_stripe_webhook_is_401(tenant, client, make_connector):
    from commands.intake.signatures import build_verifier

    source = Source.objects.create(
        tenant=tenant,
        slug="stripe",
        verifier="stripe",
        verifier_secrets=["whsec_stripe"],
        dedupe_key="stripe",
    )
    source.connectors.set([make_connector("log", kind="log")])
    body = b'{"id": "evt_1", "type": "charge.succeeded"}'
    signed = build_verifier("stripe", ["whsec_stripe"]).sign(body, NOW.timestamp())
    with time_machine.travel(NOW + timedelta(minutes=5, seconds=1), tick=False):
        replayed = client.post("/hooks/acme/stripe/", body, content_type="application/json", headers=signed)
    with time_machine.travel(NOW + timedelta(minutes=4), tick=False):
        fresh = client.post("/hooks/acme/stripe/", body, content_type="application/json", headers=signed)
    assert answer(replayed) == (
        401,
        {
            "error": "bad_signature",
            "detail": "Signature refused: timestamp outside the 300 s tolerance (replayed or clock skew).",
        },
    )
    assert fresh.status_code == 202
    assert Delivery.objects.get().event_key == "evt_1"


def test_a_source_with_no_connectors_stores_the_delivery_with_no_commands(hook_source, post_hook):
    hook_source.connectors.clear()
    status, data = answer(post_hook())
    assert (status, data["commands"]) == (202, [])
    assert Delivery.objects.count() == 1


def test_a_verifier_broken_behind_the_admins_back_is_503_not_500(hook_source, post_hook):
    Source.objects.filter(pk=hook_source.pk).update(verifier_secrets=[])
    status, data = answer(post_hook())
    assert (status, data["error"]) == (503, "source_misconfigured")


def test_one_log_line_per_request_without_body_signature_or_secret(hook_source, post_hook, caplog):
    with caplog.at_level(logging.INFO, logger="ankusa.intake"):
        post_hook(b'{"card": "4242"}', "evt-1")
        post_hook(b'{"card": "4242"}', "evt-1")
        post_hook(b'{"card": "4242"}', "evt-2", secret="wrong")
    lines = [(r.getMessage(), r.fields) for r in caplog.records if r.name == "ankusa.intake"]
    delivery = Delivery.objects.get()
    assert lines == [
        (
            "hook_accepted",
            {
                "tenant": "acme",
                "source": "orders",
                "status": 202,
                "delivery": delivery.pk,
                "commands": 2,
                "size": 16,
            },
        ),
        ("hook_duplicate", {"tenant": "acme", "source": "orders", "status": 200, "delivery": delivery.pk}),
        ("hook_refused", {"tenant": "acme", "source": "orders", "status": 401, "reason": "bad_signature"}),
    ]
    text = caplog.text
    assert "4242" not in text and HOOK_SECRET not in text and "sha256=" not in text


# --- the commit fails -----------------------------------------------------------------------------


def fail_delivery_inserts():
    """A real database refusing the insert (a trigger), on either engine."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "CREATE TRIGGER fail_delivery BEFORE INSERT ON commands_delivery "
                "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
            )
        else:
            cursor.execute(
                "CREATE FUNCTION fail_delivery() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'disk full'; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER fail_delivery BEFORE INSERT ON commands_delivery "
                "FOR EACH ROW EXECUTE FUNCTION fail_delivery()"
            )


def heal_delivery_inserts():
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("DROP TRIGGER fail_delivery")
        else:
            cursor.execute("DROP TRIGGER fail_delivery ON commands_delivery")
            cursor.execute("DROP FUNCTION fail_delivery()")


def test_a_failed_insert_releases_the_claim_and_answers_503_retry_after_1(hook_source, post_hook, caplog):
    fail_delivery_inserts()
    with caplog.at_level(logging.ERROR, logger="ankusa.intake"):
        refused = post_hook(delivery="evt-1")
    assert answer(refused) == (
        503,
        {"error": "unavailable", "detail": "Nothing was stored (the database refused it); retry."}
        if connection.vendor == "sqlite"  # SQLite reports a trigger's abort as a constraint failure
        else {"error": "unavailable", "detail": "Nothing was stored (the database did not store it); retry."},
    )
    assert refused["Retry-After"] == "1"
    heal_delivery_inserts()
    # The claim was released, not left pending: the provider's retry is accepted at once.
    assert post_hook(delivery="evt-1").status_code == 202
    assert (Delivery.objects.count(), Command.objects.count(), len(queued_payloads())) == (1, 2, 2)


@pytest.mark.django_db(transaction=True)
def test_a_commit_that_fails_at_commit_time_releases_the_claim_and_stores_nothing(
    postgres, hook_source, post_hook
):
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'replica lost'; END $$"
        )
        cursor.execute(
            "CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON commands_delivery "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_at_commit()"
        )
    try:
        refused = post_hook(delivery="evt-1")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER fail_at_commit ON commands_delivery")
            cursor.execute("DROP FUNCTION fail_at_commit()")
    assert (refused.status_code, refused["Retry-After"]) == (503, "1")
    assert (Delivery.objects.count(), Command.objects.count(), len(queued_payloads())) == (0, 0, 0)
    assert post_hook(delivery="evt-1").status_code == 202


def test_every_answer_is_counted_for_metrics_by_endpoint_and_status(hook_source, post_hook):
    def count(status: str) -> float:
        sample = REGISTRY.get_sample_value(
            "ankusa_intake_responses_total", {"endpoint": "hooks", "status": status}
        )
        return sample or 0.0

    def body_bytes() -> float:
        return REGISTRY.get_sample_value("ankusa_intake_body_bytes_sum", {"endpoint": "hooks"}) or 0.0

    before = {status: count(status) for status in ("202", "200", "401")}
    read_before = body_bytes()
    post_hook(b'{"order": 1}', "evt-1")
    post_hook(b'{"order": 1}', "evt-1")
    post_hook(b'{"order": 1}', "evt-2", secret="wrong")
    assert {status: count(status) - before[status] for status in before} == {"202": 1, "200": 1, "401": 1}
    assert body_bytes() - read_before == 3 * 12


def test_a_source_edit_reaches_the_node_once_its_kept_configuration_is_older_than_the_cache_time(
    hook_source, post_hook, settings
):
    settings.ANKUSA_INTAKE_CACHE_S = 3600
    assert post_hook(delivery="evt-1").status_code == 202
    Source.objects.filter(pk=hook_source.pk).update(verifier_secrets=["rotated"])
    assert post_hook(delivery="evt-2").status_code == 202  # the old secret, as kept
    settings.ANKUSA_INTAKE_CACHE_S = 0
    assert post_hook(delivery="evt-3").status_code == 401
    assert post_hook(delivery="evt-3", secret="rotated").status_code == 202


def test_an_expired_source_is_read_again_by_one_thread_while_the_others_go_on_with_the_kept_one(
    hook_source, settings, django_assert_num_queries
):
    settings.ANKUSA_INTAKE_CACHE_S = 1
    now = timezone.now()
    kept = hooks.find_route("acme", "orders", now)
    expired = dataclasses.replace(kept, read_at=kept.read_at - 2)
    hooks._routes["acme", "orders"] = expired
    with hooks._rereading, django_assert_num_queries(0):  # another thread is reading it again
        assert hooks.find_route("acme", "orders", now) is expired
    with django_assert_num_queries(3):  # the source with its tenant, its overrides, its connectors
        again = hooks.find_route("acme", "orders", now)
    assert again is not expired and again.read_at > kept.read_at
    assert hooks.find_route("acme", "orders", now) is again


def test_with_no_cache_time_every_webhook_reads_its_source(hook_source, settings, django_assert_num_queries):
    settings.ANKUSA_INTAKE_CACHE_S = 0
    now = timezone.now()
    hooks.find_route("acme", "orders", now)
    with hooks._rereading, django_assert_num_queries(3):
        hooks.find_route("acme", "orders", now)


def test_a_host_the_site_does_not_serve_is_a_400_json(hook_source, post_hook):
    status, data = answer(post_hook(HTTP_HOST="attacker.example"))
    assert (status, data) == (
        400,
        {"error": "bad_request", "detail": "The request was refused as malformed."},
    )
    assert Delivery.objects.count() == 0
