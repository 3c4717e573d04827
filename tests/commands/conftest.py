"""Fixtures for the commands tests: a tenant, connectors, commands, a local HTTP sink, and what the
intake tests need (a signed source, a webhook poster, a fresh claim store per test)."""

from __future__ import annotations

import time

import pytest

from commands.intake.hooks import forget_routes
from commands.intake.signatures import build_verifier
from commands.models import Command, Connector, Source
from limits.models import Tenant
from limits.store import forget_store
from tests.commands.sink import Sink


@pytest.fixture
def tenant(db):
    return Tenant.objects.create(slug="acme", name="Acme")


@pytest.fixture
def sink():
    with Sink() as running:
        yield running


@pytest.fixture
def make_connector(tenant):
    def make(name: str = "receiver", **fields) -> Connector:
        fields.setdefault("kind", "http")
        return Connector.objects.create(tenant=tenant, name=name, **fields)

    return make


@pytest.fixture
def make_command(tenant):
    def make(connector: Connector, payload: dict | None = None, **fields) -> Command:
        return Command.objects.create(
            tenant=tenant, connector=connector, payload=payload if payload is not None else {"n": 1}, **fields
        )

    return make


# --- intake -------------------------------------------------------------------------------------

HOOK_SECRET = "hook-secret-1"


@pytest.fixture(autouse=True)
def fresh_store():
    """Each test starts with a new process-wide quota and claim store and no kept source
    configuration: no claim or cached row outlives its test."""
    forget_store()
    forget_routes()
    yield
    forget_store()
    forget_routes()


@pytest.fixture(autouse=True)
def no_kept_dispatcher():
    """A Celery drain run in the test's process keeps its dispatcher for the next (as a pool
    process does): it ends with its test, its threads and connections with it."""
    yield
    from commands import tasks

    tasks.forget_dispatcher()


@pytest.fixture
def hook_source(tenant, make_connector):
    """``acme/orders``: GitHub-signed, deduped on X-GitHub-Delivery (not on its body: these tests
    send one body under several ids; test_body_dedupe covers that), fanning out to two connectors."""
    source = Source.objects.create(
        tenant=tenant,
        slug="orders",
        verifier="github",
        verifier_secrets=[HOOK_SECRET],
        dedupe_key="github",
        dedupe_body=False,
    )
    source.connectors.set(
        [
            make_connector("log", kind="log"),
            make_connector("http", url="http://127.0.0.1:9/", idempotent=True),
        ]
    )
    return source


def github_headers(body: bytes, delivery: str | None, secret: str = HOOK_SECRET) -> dict[str, str]:
    headers = build_verifier("github", [secret]).sign(body, time.time())
    if delivery is not None:
        headers["X-GitHub-Delivery"] = delivery
    return headers


@pytest.fixture
def post_hook(client):
    """POST a GitHub-signed webhook to ``/hooks/<tenant>/<source>/`` through the whole site."""

    def post(
        body: bytes = b'{"order": "A-1"}',
        delivery: str | None = "delivery-1",
        *,
        path: str = "/hooks/acme/orders/",
        secret: str = HOOK_SECRET,
        headers: dict | None = None,
        **extra,
    ):
        signed = {**github_headers(body, delivery, secret), **(headers or {})}
        return client.post(path, body, content_type="application/json", headers=signed, **extra)

    return post
