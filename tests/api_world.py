"""A small world for the REST API tests: two tenants with one of everything each, the six kinds of
caller (anonymous, tenant A's token, tenant B's token, a viewer, an operator, an admin), each a
real ``ApiToken`` sent as ``Authorization: Bearer``.

``tests/conftest.py`` makes the ``world`` and ``call`` fixtures available to every test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from rest_framework.test import APIClient

from commands.models import Attempt, AuditEntry, Command, Connector, Delivery, Source
from commands.retry import Outlook
from commands.states import State
from limits.models import ApiToken, LimitOverride, Tenant
from limits.store import forget_store
from tests.staff import staff_user, token_for

CALLERS = ("anonymous", "tenant_a", "tenant_b", "viewer", "operator", "admin")


@dataclass
class Side:
    """One tenant's rows."""

    tenant: Tenant
    connector: Connector
    spare_connector: Connector  # no commands point at it: it can be deleted
    source: Source
    spare_source: Source
    command: Command  # failed, with one attempt
    delivery: Delivery


@dataclass
class World:
    a: Side
    b: Side
    audit: AuditEntry
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, caller: str) -> APIClient:
        client = APIClient()
        if caller != "anonymous":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.tokens[caller]}")
        return client


def make_side(slug: str) -> Side:
    tenant = Tenant.objects.create(slug=slug, name=slug.title())
    connector = Connector.objects.create(
        tenant=tenant, name="billing", kind="http", url="http://127.0.0.1:9/"
    )
    spare = Connector.objects.create(tenant=tenant, name="spare", kind="log")
    source = Source.objects.create(
        tenant=tenant, slug="orders", verifier="github", verifier_secrets=["s3cret"]
    )
    source.connectors.set([connector])
    spare_source = Source.objects.create(tenant=tenant, slug="spare")
    delivery = Delivery.objects.create(
        tenant=tenant,
        source=source,
        event_key=f"{slug}-event-1",
        headers={"Content-Type": "application/json", "X-Hub-Signature-256": "sha256=feed"},
        body='{"order": 1}',
        size=12,
    )
    command = Command.objects.create(
        tenant=tenant,
        connector=connector,
        source=source,
        delivery=delivery,
        payload={"order": 1},
        state=State.FAILED,
        last_outlook=Outlook.NEVER,
        attempts=1,
        skip_reason="never",
        last_error_class="HTTPError",
        last_error="422",
    )
    Attempt.objects.create(
        command=command, number=1, started_at=command.created_at, ok=False, outlook=Outlook.NEVER
    )
    LimitOverride.objects.create(tenant=tenant, kind="bytes", rate=100, burst=1000)
    return Side(tenant, connector, spare, source, spare_source, command, delivery)


def staff_token(group: str) -> str:
    return token_for(staff_user(group))


@pytest.fixture
def world(db) -> World:
    forget_store()
    a, b = make_side("acme"), make_side("globex")
    audit = AuditEntry.objects.create(username="admin", action="cancel", via="admin", count=1, done=1)
    audit.commands.set([a.command])
    world = World(a, b, audit)
    world.tokens["tenant_a"] = ApiToken.issue(name="a", tenant=a.tenant)[1]
    world.tokens["tenant_b"] = ApiToken.issue(name="b", tenant=b.tenant)[1]
    for group in ("viewer", "operator", "admin"):
        world.tokens[group] = staff_token(group)
    yield world
    forget_store()


@pytest.fixture
def call(world):
    """``call(caller, method, path, body=None)`` -> (status, decoded JSON or None)."""

    def call(caller: str, method: str, path: str, body=None):
        client = world.client(caller)
        kwargs = {}
        if body is not None:
            kwargs = {"data": json.dumps(body), "content_type": "application/json"}
        response = getattr(client, method.lower())(path, **kwargs)
        data = json.loads(response.content) if response.content else None
        return response.status_code, data

    return call
