"""Helpers for the staff admin tests: people in the migration's groups, and failed commands."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.utils import timezone

from commands.models import Command, Connector
from commands.states import State
from tests.staff import staff_user


def login_as(client, group: str | None, username: str | None = None) -> User:
    """A staff user in ``group`` (viewer / operator / admin; None: a superuser), logged in."""
    if group is None:
        name = username or "root"
        user = User.objects.create_superuser(name, f"{name}@example.com", "pw")
    else:
        user = staff_user(group, username)
    client.force_login(user)
    return user


def make_failed(connector: Connector, *, outlook: str = "again", reason: str = "", **fields) -> Command:
    """A command that failed once with ``outlook``, waiting for ``reason``."""
    fields.setdefault("payload", {"order": "A-1"})
    fields.setdefault("attempts", 1)
    fields.setdefault("last_error_class", "HTTPStatus")
    fields.setdefault("last_error", "HTTP 503 from the receiver")
    return Command.objects.create(
        tenant=connector.tenant,
        connector=connector,
        state=State.FAILED,
        state_changed_at=timezone.now(),
        last_outlook=outlook,
        skip_reason=reason,
        **fields,
    )
