"""Sources and deliveries: a bad configuration fails when saved, secrets are write-only, and the
database refuses a second delivery of one event or a second API command for one key."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from commands.models import Command, Delivery, Source
from tests.commands.conftest import HOOK_SECRET


def errors_of(source: Source) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        source.full_clean()
    return caught.value.message_dict


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        ({"verifier": "gitlab"}, {"verifier": ["Value 'gitlab' is not a valid choice."]}),
        (
            {"verifier": "github", "verifier_secrets": []},
            {
                "verifier_secrets": [
                    "secrets: give at least one non-empty secret; every entry must be a string"
                ]
            },
        ),
        (
            {"verifier": "standard", "verifier_secrets": ["not base64!"]},
            {"verifier_secrets": ["secrets[0]: must be base64, optionally prefixed with whsec_"]},
        ),
        (
            {"verifier": "stripe", "verifier_secrets": ["s"], "verifier_options": {"tolerance_s": 0}},
            {"verifier_options": ["options.tolerance_s: must be a whole number of seconds from 1 to 86400"]},
        ),
        (
            {"verifier": "github", "verifier_secrets": ["s"], "verifier_options": {"header": "X"}},
            {"verifier_options": ["options: unknown option(s) header; allowed: none"]},
        ),
        (
            {"dedupe_key": "body:id"},
            {
                "dedupe_key": [
                    "'body:id' is not a preset (none, github, standard, svix, shopify, stripe), "
                    "header:<Name> or json:<path>"
                ]
            },
        ),
        ({"dedupe_key": "header:Bad Name"}, {"dedupe_key": ["'Bad Name' is not a valid header name"]}),
    ],
)
def test_a_bad_configuration_fails_at_save_time_naming_the_field(tenant, fields, errors):
    assert errors_of(Source(tenant=tenant, slug="s", **fields)) == errors


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"verifier": "github", "verifier_secrets": ["a", "b"], "dedupe_key": "github"},
        {
            "verifier": "hmac",
            "verifier_secrets": ["a"],
            "verifier_options": {"header": "X-Sig", "encoding": "base64"},
        },
        {"verifier": "stripe", "verifier_secrets": ["whsec_x"], "dedupe_key": "json:data.object.id"},
        {"dedupe_key": "header:X-Request-Id"},
    ],
)
def test_a_good_configuration_passes(tenant, fields):
    Source(tenant=tenant, slug="s", **fields).full_clean()


def test_the_database_refuses_a_second_delivery_of_one_event(hook_source):
    Delivery.objects.create(tenant=hook_source.tenant, source=hook_source, event_key="evt-1", size=0)
    Delivery.objects.create(tenant=hook_source.tenant, source=hook_source, event_key="", size=0)
    Delivery.objects.create(
        tenant=hook_source.tenant, source=hook_source, event_key="", size=0
    )  # no key: no guard
    with pytest.raises(IntegrityError), transaction.atomic():
        Delivery.objects.create(tenant=hook_source.tenant, source=hook_source, event_key="evt-1", size=0)


def test_one_api_command_per_key_and_tenant_but_a_fan_out_may_share_its_event_key(hook_source):
    tenant = hook_source.tenant
    log, http = hook_source.connectors.order_by("name")
    for connector in (log, http):  # one webhook's fan-out: two commands, one key
        Command.objects.create(
            tenant=tenant, connector=connector, source=hook_source, idempotency_key="evt-1"
        )
    Command.objects.create(tenant=tenant, connector=log, idempotency_key="k-1")
    Command.objects.create(tenant=tenant, connector=log, idempotency_key="")
    Command.objects.create(tenant=tenant, connector=log, idempotency_key="")
    with pytest.raises(IntegrityError), transaction.atomic():
        Command.objects.create(tenant=tenant, connector=http, idempotency_key="k-1")


# --- admin ---------------------------------------------------------------------------------------


def source_form(source: Source, **changes) -> dict:
    data = {
        "tenant": source.tenant_id,
        "slug": source.slug,
        "connectors": [c.pk for c in source.connectors.all()],
        "verifier": source.verifier,
        "verifier_options": "{}",
        "dedupe_key": source.dedupe_key,
        "verifier_secrets": "",
    }
    data.update(changes)
    return data


def test_the_source_page_never_shows_a_secret_back(admin_client, hook_source):
    change = admin_client.get(reverse("admin:commands_source_change", args=[hook_source.pk]))
    listing = admin_client.get(reverse("admin:commands_source_changelist"))
    assert change.status_code == listing.status_code == 200
    for page in (change, listing):
        assert HOOK_SECRET not in page.content.decode()
    assert "1 set" in listing.content.decode()
    assert "/hooks/acme/orders/" in change.content.decode()


def test_rotation_in_the_admin_adds_the_new_secret_first_then_removes_the_old(admin_client, hook_source):
    url = reverse("admin:commands_source_change", args=[hook_source.pk])
    assert admin_client.post(url, source_form(hook_source, verifier_secrets="second")).status_code == 302
    hook_source.refresh_from_db()
    assert hook_source.verifier_secrets == ["second", HOOK_SECRET]
    # Saving with an empty field keeps the list; ticking #2 removes the old one.
    assert admin_client.post(url, source_form(hook_source)).status_code == 302
    assert admin_client.post(url, source_form(hook_source, remove_secrets=["1"])).status_code == 302
    hook_source.refresh_from_db()
    assert hook_source.verifier_secrets == ["second"]


def test_removing_every_secret_of_a_signed_source_is_refused_with_a_message(admin_client, hook_source):
    url = reverse("admin:commands_source_change", args=[hook_source.pk])
    response = admin_client.post(url, source_form(hook_source, remove_secrets=["0"]))
    assert response.status_code == 200
    assert "give at least one non-empty secret" in response.content.decode()
    hook_source.refresh_from_db()
    assert hook_source.verifier_secrets == [HOOK_SECRET]


def test_the_delivery_list_costs_the_same_queries_for_3_and_30_deliveries(admin_client, hook_source):
    url = reverse("admin:commands_delivery_changelist")

    def queries_with(n: int) -> int:
        Delivery.objects.bulk_create(
            Delivery(tenant=hook_source.tenant, source=hook_source, event_key=f"e-{n}-{i}", size=2, body="{}")
            for i in range(n)
        )
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        return len(captured)

    assert queries_with(3) == queries_with(27)


def test_deliveries_are_history_in_the_admin(admin_client, hook_source, post_hook):
    post_hook()
    delivery = Delivery.objects.get()
    page = admin_client.get(reverse("admin:commands_delivery_change", args=[delivery.pk]))
    assert page.status_code == 200
    assert "order" in page.content.decode()
    assert admin_client.get(reverse("admin:commands_delivery_add")).status_code == 403
    deleted = admin_client.post(
        reverse("admin:commands_delivery_delete", args=[delivery.pk]), {"post": "yes"}
    )
    assert deleted.status_code == 403
    assert Delivery.objects.count() == 1
