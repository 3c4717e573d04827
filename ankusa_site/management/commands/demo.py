"""``manage.py demo``: demo data and a staff login, safe to run again and again.

Creates (or leaves as they are) a tenant ``demo`` and a superuser ``admin`` whose password is
generated once into ``var/admin-password`` and printed on every run, so ``make run`` always
prints a login that works.

It also gives the tenant two connectors — ``log`` (writes to the log) and ``http`` (posts to the
demo receiver that ``make run`` serves with DEBUG on, ``--receiver-url``) — a source ``orders``
fanning out to both, and, the first time only, three commands for the dispatch loop beside
gunicorn to send: one per connector, and one the receiver answers 503, which shows the retry
schedule ending in ``attempts-spent``.

The source ``orders`` is GitHub-signed (its secret generated once into ``var/demo-webhook-secret``)
and dedupes on ``X-GitHub-Delivery``; the tenant gets an API token, issued once, whose plaintext
is kept in ``var/demo-token`` (0600) because it is shown only when issued. Every run prints a
ready-to-paste ``curl`` for a signed webhook and one for ``POST /api/v1/commands/`` (``--site-url``).
"""

from __future__ import annotations

import secrets
import shlex
import time
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ankusa_site.core.varfiles import private_dir, write_private
from commands.models import Command as CommandModel
from commands.models import Connector, Source
from limits import tokens
from limits.models import ApiToken, Tenant

ADMIN_USERNAME = "admin"
DEMO_RECEIVER_PATH = "/demo/receiver/"
RECEIVER_URL = f"http://127.0.0.1:8000{DEMO_RECEIVER_PATH}"
SITE_URL = "http://127.0.0.1:8000"
SAMPLE_EVENT = b'{"order": "A-3", "action": "ship"}'


def var_secret(name: str, make) -> str:
    """A value generated once into ``var/<name>`` (0600) and read back on every later run."""
    path: Path = settings.VAR_DIR / name
    if not path.exists():
        write_private(private_dir(path.parent) / name, make())
    return path.read_text().strip()


def curl(url: str, headers: dict[str, str], body: bytes) -> str:
    parts = ["curl", "-i", "-X", "POST", url]
    for name, value in headers.items():
        parts += ["-H", f"{name}: {value}"]
    parts += ["--data-binary", body.decode()]
    return " ".join(shlex.quote(part) for part in parts)


class Command(BaseCommand):
    help = "Load the demo tenant and a staff login (idempotent) and print the login."

    def add_arguments(self, parser):
        parser.add_argument("--receiver-url", default=RECEIVER_URL, help="Where the http connector posts.")
        parser.add_argument("--site-url", default=SITE_URL, help="Where the printed curl lines send to.")

    def handle(self, *args, receiver_url=RECEIVER_URL, site_url=SITE_URL, **options):
        for flag, url in (("--receiver-url", receiver_url), ("--site-url", site_url)):
            # By a connector's own rules: the receiver's is one, and curl takes the site's as one.
            unsaved = Connector(kind="http", url=url)
            try:
                unsaved.clean_fields(exclude=[f.name for f in Connector._meta.fields if f.name != "url"])
                unsaved.clean()
            except ValidationError as exc:
                raise CommandError(f"{flag}: {' '.join(exc.messages)}") from None
        with transaction.atomic():
            tenant = self.demo_tenant()
            connectors = self.demo_connectors(tenant, receiver_url)
            source = self.demo_source(tenant, connectors)
            self.demo_commands(source, connectors)
            token = self.demo_token(tenant)
            password = self.admin_password()
            self.admin_user(password)
        self.stdout.write(
            f"Demo tenant: {tenant.slug}, source {source.slug} -> {', '.join(c.name for c in connectors)}"
        )
        self.stdout.write("Send a signed webhook (paste it twice: the second answer is a duplicate):")
        self.stdout.write("  " + self.webhook_curl(source, site_url.rstrip("/")))
        self.stdout.write("Submit a command with the demo tenant's API token:")
        self.stdout.write("  " + self.submit_curl(token, site_url.rstrip("/")))
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
        if http.url != receiver_url and urlsplit(http.url).path == DEMO_RECEIVER_PATH:
            # Run again on another port (make run PORT=...): follow the receiver there, unless a
            # person pointed the connector somewhere else than a demo receiver.
            Connector.objects.filter(pk=http.pk).update(url=receiver_url)
        return [log, http]

    def demo_source(self, tenant: Tenant, connectors: list[Connector]) -> Source:
        source, created = Source.objects.get_or_create(tenant=tenant, slug="orders")
        if created:
            source.connectors.set(connectors)
        secret = var_secret("demo-webhook-secret", lambda: secrets.token_urlsafe(24))
        if (source.verifier, source.verifier_secrets[:1], source.dedupe_key) != (
            "github",
            [secret],
            "github",
        ):
            source.verifier, source.verifier_secrets, source.dedupe_key = "github", [secret], "github"
            source.full_clean()
            source.save()
        return source

    def demo_token(self, tenant: Tenant) -> str:
        """The tenant's demo token: the one in ``var/demo-token`` while it still works, else a new one."""
        path = settings.VAR_DIR / "demo-token"
        if path.exists():
            plaintext = path.read_text().strip()
            found = tokens.split(plaintext)
            token = found and ApiToken.objects.usable().filter(tenant=tenant, key_id=found[0]).first()
            if token and tokens.secret_matches(found[1], token.key_hash):
                return plaintext
            path.unlink()
        return var_secret("demo-token", lambda: ApiToken.issue(name="demo", tenant=tenant)[1])

    def webhook_curl(self, source: Source, site_url: str) -> str:
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": f"demo-{secrets.token_hex(4)}",
            **source.build_verifier().sign(SAMPLE_EVENT, time.time()),
        }
        return curl(f"{site_url}/hooks/{source.tenant.slug}/{source.slug}/", headers, SAMPLE_EVENT)

    def submit_curl(self, token: str, site_url: str) -> str:
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Idempotency-Key": f"demo-{secrets.token_hex(4)}",
        }
        body = b'{"connector": "log", "payload": {"order": "A-4", "action": "ship"}}'
        return curl(f"{site_url}/api/v1/commands/", headers, body)

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
        return var_secret("admin-password", lambda: secrets.token_urlsafe(12))

    def admin_user(self, password: str) -> None:
        user, _ = get_user_model().objects.get_or_create(username=ADMIN_USERNAME)
        user.is_staff = user.is_superuser = user.is_active = True
        if not user.check_password(password):
            user.set_password(password)
        user.save()
