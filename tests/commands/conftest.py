"""Fixtures for the commands tests: a tenant, connectors, commands and a local HTTP sink."""

from __future__ import annotations

import pytest

from commands.models import Command, Connector
from limits.models import Tenant
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
