"""Data migrations of ``commands``, run against rows made with the models as they were before."""

from __future__ import annotations

import base64

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from commands.models import Attempt, Connector

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("commands", "0005_person_links_and_attempt_time")


@pytest.fixture
def rolled_back():
    """``roll_back(migration)`` gives the models of ``commands`` at that migration (the database
    migrated back to it) to make rows with; ``migrate()`` then migrates to the latest, as the end
    of the test does in any case."""
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("commands")

    def roll_back(target):
        executor = MigrationExecutor(connection)
        executor.migrate([target])
        return executor.loader.project_state([target]).apps

    def migrate():
        MigrationExecutor(connection).migrate(latest)

    yield roll_back, migrate
    migrate()


@pytest.fixture
def connector_before(rolled_back):
    """Make connectors with the models of ``BEFORE``; the test then migrates to the latest."""
    roll_back, migrate_latest = rolled_back
    apps = roll_back(BEFORE)
    tenant = apps.get_model("limits", "Tenant").objects.create(slug="acme", name="Acme")
    made = []

    def make(**fields):
        fields = {
            "kind": "http",
            "url": "https://example.com/hook",
            "headers": {},
            "status_map": {},
            **fields,
        }
        made.append(apps.get_model("commands", "Connector").objects.create(tenant=tenant, **fields).pk)
        return made[-1]

    def migrate():
        migrate_latest()
        return [Connector.objects.get(pk=pk) for pk in made]

    return make, migrate


def basic(pair: str | bytes) -> str:
    return "Basic " + base64.b64encode(pair.encode() if isinstance(pair, str) else pair).decode()


def test_a_url_with_user_and_password_becomes_the_basic_authorization_secret(connector_before):
    make, migrate = connector_before
    make(name="a", url="https://ops:p%40ss@example.com:8443/hook?x=1")
    (connector,) = migrate()
    assert connector.url == "https://example.com:8443/hook?x=1"
    assert (connector.secret_header, connector.secret) == ("Authorization", basic("ops:p@ss"))


def test_a_urls_percent_escapes_go_into_the_basic_credential_as_the_bytes_they_are(connector_before):
    make, migrate = connector_before
    make(name="a", url="https://u:p%E9ss@example.com/")
    (connector,) = migrate()
    assert connector.secret == basic(b"u:p\xe9ss")


def test_an_empty_userinfo_is_dropped_and_adds_no_credential(connector_before):
    make, migrate = connector_before
    make(name="a", url="https://@example.com/h")
    (connector,) = migrate()
    assert connector.url == "https://example.com/h"
    assert (connector.secret_header, connector.secret) == ("", "")


def test_a_url_credential_fills_a_secret_header_that_was_named_without_a_secret(connector_before):
    make, migrate = connector_before
    make(name="a", url="https://u:pw@example.com/", secret_header="X-Api-Key", secret="")
    (connector,) = migrate()
    assert (connector.secret_header, connector.secret) == ("Authorization", basic("u:pw"))


def test_a_urls_credentials_beside_a_secret_header_are_dropped_and_the_secret_kept(connector_before):
    make, migrate = connector_before
    make(name="a", url="https://token@example.com/hook", secret_header="X-Api-Key", secret="k-1")
    (connector,) = migrate()
    assert connector.url == "https://example.com/hook"
    assert (connector.secret_header, connector.secret) == ("X-Api-Key", "k-1")


def test_a_credential_header_becomes_the_secret_header_with_the_same_value(connector_before):
    make, migrate = connector_before
    make(name="a", headers={"authorization": "Bearer t-1", "X-Team": "ops"})
    (connector,) = migrate()
    assert connector.headers == {"X-Team": "ops"}
    assert (connector.secret_header, connector.secret) == ("authorization", "Bearer t-1")


def test_a_credential_header_that_was_sent_wins_over_the_urls_which_never_was(connector_before):
    make, migrate = connector_before
    make(name="a", url="https://ops:pw@example.com/", headers={"Cookie": "s=1"})
    (connector,) = migrate()
    assert connector.url == "https://example.com/"
    assert connector.headers == {}
    assert (connector.secret_header, connector.secret) == ("Cookie", "s=1")


def test_of_several_credential_headers_authorization_becomes_the_secret_and_the_others_stay(connector_before):
    make, migrate = connector_before
    make(name="a", headers={"Authorization": "Bearer a", "X-Api-Key": "k"})
    (connector,) = migrate()
    assert (connector.secret_header, connector.secret) == ("Authorization", "Bearer a")
    assert connector.headers == {"X-Api-Key": "k"}


def test_an_empty_credential_header_is_not_made_a_secret(connector_before):
    make, migrate = connector_before
    make(name="a", headers={"Authorization": ""})
    (connector,) = migrate()
    assert connector.headers == {"Authorization": ""}
    assert (connector.secret_header, connector.secret) == ("", "")


def test_a_credential_header_beside_a_secret_header_is_left_as_it_is(connector_before):
    make, migrate = connector_before
    make(name="a", headers={"Cookie": "s=1"}, secret_header="Authorization", secret="Bearer t")
    (connector,) = migrate()
    assert connector.headers == {"Cookie": "s=1"}
    assert (connector.secret_header, connector.secret) == ("Authorization", "Bearer t")


def test_a_connector_without_credentials_in_shown_fields_is_not_touched(connector_before):
    make, migrate = connector_before
    make(name="a", headers={"X-Team": "ops"}, secret_header="Authorization", secret="Bearer t")
    make(name="b", url="")
    before = list(Connector.objects.order_by("name").values_list("updated_at", flat=True))
    connectors = migrate()
    assert [c.updated_at for c in connectors] == before
    assert connectors[0].url == "https://example.com/hook" and connectors[0].headers == {"X-Team": "ops"}


def test_a_secret_a_receiver_echoed_into_a_recorded_answer_is_masked(rolled_back):
    roll_back, migrate = rolled_back
    apps = roll_back(("commands", "0007_credential_headers_by_their_words"))
    tenant = apps.get_model("limits", "Tenant").objects.create(slug="acme", name="Acme")
    connector = apps.get_model("commands", "Connector").objects.create(
        tenant=tenant, name="echo", kind="http", url="https://example.com/hook", headers={}, status_map={},
        secret_header="Authorization", secret="Bearer TOPSECRET-42",
    )  # fmt: skip
    plain = apps.get_model("commands", "Connector").objects.create(
        tenant=tenant, name="plain", kind="http", url="https://example.com/hook", headers={}, status_map={}
    )
    command = apps.get_model("commands", "Command").objects.create(
        tenant=tenant, connector=connector, payload={}
    )
    other = apps.get_model("commands", "Command").objects.create(tenant=tenant, connector=plain, payload={})
    attempt = apps.get_model("commands", "Attempt")
    now = timezone.now()
    echoed = attempt.objects.create(
        command=command, number=1, started_at=now, response_excerpt='{"Authorization": "Bearer TOPSECRET-42"}'
    )
    cut = attempt.objects.create(
        command=command, number=2, started_at=now, response_excerpt="x" * 989 + "Bearer TOPS"
    )
    unrelated = attempt.objects.create(
        command=other, number=1, started_at=now, response_excerpt="Bearer TOPSECRET-42 is not its secret"
    )
    migrate()
    assert Attempt.objects.get(pk=echoed.pk).response_excerpt == '{"Authorization": "[redacted]"}'
    assert Attempt.objects.get(pk=cut.pk).response_excerpt == "x" * 989 + "[redacted]"
    assert Attempt.objects.get(pk=unrelated.pk).response_excerpt == "Bearer TOPSECRET-42 is not its secret"


def test_a_header_whose_name_says_credential_becomes_the_secret_where_there_is_none(connector_before):
    make, migrate = connector_before
    make(name="a", headers={"X-Team": "ops", "X-Auth-Token": "hunter2", "DD-API-KEY": "k1"})
    make(name="b", headers={"Private-Token": "t1"}, secret_header="Authorization", secret="Bearer kept")
    (moved, kept) = migrate()
    assert (moved.secret_header, moved.secret) == ("DD-API-KEY", "k1")  # the first by name
    assert moved.headers == {"X-Team": "ops", "X-Auth-Token": "hunter2"}  # one secret: a person chooses
    assert (kept.secret, kept.headers) == ("Bearer kept", {"Private-Token": "t1"})
