"""``manage.py token issue|revoke``: API tokens from the shell (the admin does the same).

``issue`` applies the model's validation, as the admin does (the name is stripped as the admin's
form strips it); a refusal is a ``CommandError`` naming the option and the rule.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from limits import tokens
from limits.models import ApiToken, Tenant


class Command(BaseCommand):
    help = "Issue an API token for a tenant or a staff user (printed once), or revoke one."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        issue = sub.add_parser("issue", help="Issue a token and print it once.")
        owner = issue.add_mutually_exclusive_group(required=True)
        owner.add_argument("--tenant", help="tenant slug")
        owner.add_argument("--user", help="staff username")
        issue.add_argument("--name", required=True, help="what uses the token")
        revoke = sub.add_parser("revoke", help="Revoke a token by its key id.")
        revoke.add_argument("key_id")

    def handle(self, *args, action, **options):
        if action == "issue":
            self.issue(options)
        else:
            self.revoke(options["key_id"])

    def issue(self, options) -> None:
        tenant = user = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
        else:
            user = get_user_model().objects.filter(username=options["user"], is_staff=True).first()
            if user is None:
                raise CommandError(f"No staff user {options['user']!r}.")
        try:
            _, plaintext = ApiToken.issue(name=options["name"].strip(), tenant=tenant, user=user)
        except ValidationError as exc:
            raise CommandError(_refusal(exc)) from None
        self.stdout.write(plaintext)

    def revoke(self, key_id: str) -> None:
        count = ApiToken.objects.filter(key_id=key_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if not count:
            raise CommandError(f"No active token {tokens.display(key_id)}.")
        self.stdout.write(f"Revoked {tokens.display(key_id)}.")


def _refusal(exc: ValidationError) -> str:
    """The model's refusal as one line, each message after the option it is about."""
    return "; ".join(
        (" ".join(messages) if field == NON_FIELD_ERRORS else f"--{field}: {' '.join(messages)}")
        for field, messages in exc.message_dict.items()
    )
