"""``manage.py demo``: demo data and a staff login, safe to run again and again.

Creates (or leaves as they are) a tenant ``demo`` and a superuser ``admin`` whose password is
generated once into ``var/admin-password`` and printed on every run, so ``make run`` always
prints a login that works.

It also gives the tenant two connectors — ``log`` (writes to the log) and ``http`` (posts to the
demo receiver that ``make run`` serves with DEBUG on, ``--receiver-url``) — a source ``orders``
fanning out to both, and, the first time only, three commands for the dispatch loop beside
gunicorn to send: one per connector, and one the receiver answers 503, which shows the retry
schedule ending in ``attempts-spent``.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from commands.models import Command as CommandModel
from commands.models import Connector, Source
from limits.models import Tenant

ADMIN_USERNAME = "admin"
RECEIVER_URL = "http://127.0.0.1:8000/demo/receiver/"


class Command(BaseCommand):
    help = "Load the demo tenant and a staff login (idempotent) and print the login."

    def add_arguments(self, parser):
        parser.add_argument("--receiver-url", default=RECEIVER_URL, help="Where the http connector posts.")

    def handle(self, *args, receiver_url=RECEIVER_URL, **options):
        with transaction.atomic():
            tenant = self.demo_tenant()
            connectors = self.demo_connectors(tenant, receiver_url)
            source = self.demo_source(tenant, connectors)
            self.demo_commands(source, connectors)
            password = self.admin_password()
            self.admin_user(password)
        self.stdout.write(
            f"Demo tenant: {tenant.slug}, source {source.slug} -> {', '.join(c.name for c in connectors)}"
        )
        self.stdout.write(self.style.SUCCESS(f"Staff login: {ADMIN_USERNAME} / {password}"))

    def demo_tenant(self) -> Tenant:
        tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo tenant"})
        return tenant

    def demo_connectors(self, tenant: Tenant, receiver_url: str) -> list[Connector]:
        log, _ = Connector.objects.get_or_create(tenant=tenant, name="log", defaults={"kind": "log"})
        http, _ = Connector.objects.get_or_create(
            tenant=tenant,
            name="http",
            # The demo receiver stores nothing, so two sends of one command are one instruction.
            defaults={"kind": "http", "url": receiver_url, "idempotent": True},
        )
        return [log, http]

    def demo_source(self, tenant: Tenant, connectors: list[Connector]) -> Source:
        source, created = Source.objects.get_or_create(tenant=tenant, slug="orders")
        if created:
            source.connectors.set(connectors)
        return source

    def demo_commands(self, source: Source, connectors: list[Connector]) -> None:
        if CommandModel.objects.filter(tenant=source.tenant).exists():
            return
        log, http = connectors
        for connector, payload in [
            (log, {"order": "A-1", "action": "ship"}),
            (http, {"order": "A-1", "action": "ship"}),
            (http, {"order": "A-2", "action": "ship", "respond": 503}),
        ]:
            CommandModel.objects.create(
                tenant=source.tenant,
                connector=connector,
                source=source,
                payload=payload,
                state=source.initial_state,
            )

    def admin_password(self) -> str:
        path = settings.VAR_DIR / "admin-password"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(12))
            path.chmod(0o600)
        return path.read_text().strip()

    def admin_user(self, password: str) -> None:
        user, _ = get_user_model().objects.get_or_create(username=ADMIN_USERNAME)
        user.is_staff = user.is_superuser = user.is_active = True
        if not user.check_password(password):
            user.set_password(password)
        user.save()
