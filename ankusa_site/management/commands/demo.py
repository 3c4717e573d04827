"""``manage.py demo``: demo data and a staff login, safe to run again and again.

Creates (or leaves as they are) a tenant ``demo`` and a superuser ``admin`` whose password is
generated once into ``var/admin-password`` and printed on every run, so ``make run`` always
prints a login that works.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from limits.models import Tenant

ADMIN_USERNAME = "admin"


class Command(BaseCommand):
    help = "Load the demo tenant and a staff login (idempotent) and print the login."

    def handle(self, *args, **options):
        with transaction.atomic():
            tenant = self.demo_tenant()
            password = self.admin_password()
            self.admin_user(password)
        self.stdout.write(f"Demo tenant: {tenant.slug}")
        self.stdout.write(self.style.SUCCESS(f"Staff login: {ADMIN_USERNAME} / {password}"))

    def demo_tenant(self) -> Tenant:
        tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo tenant"})
        return tenant

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
