"""DRF authentication with ``limits.ApiToken`` (``Authorization: Bearer ank_…``).

A staff user's token authenticates as that user. A tenant's token authenticates as a
``TenantClient``: authenticated, never staff, holding no model permission, and carrying the
tenant every view must scope its queryset to (``request.user.tenant``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from limits import tokens
from limits.models import ApiToken, Tenant

KEYWORD = b"bearer"


@dataclass(frozen=True, eq=False)
class TenantClient:
    """The user a tenant token authenticates as."""

    tenant: Tenant
    token: ApiToken

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    @property
    def username(self) -> str:
        return f"tenant:{self.tenant.slug}"

    def __str__(self) -> str:
        return self.username

    def has_perm(self, perm, obj=None) -> bool:
        return False

    def has_perms(self, perms, obj=None) -> bool:
        return False

    def has_module_perms(self, app_label) -> bool:
        return False

    def get_all_permissions(self, obj=None) -> set:
        return set()


def tenant_of(user) -> Tenant | None:
    """The tenant a request acts for (None for staff and anonymous users)."""
    return user.tenant if isinstance(user, TenantClient) else None


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Send 'Authorization: Bearer <token>' with one token.")
        try:
            plaintext = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token is not ASCII.") from None
        found = tokens.split(plaintext)
        if found is None:
            raise exceptions.AuthenticationFailed("Malformed token.")
        key_id, secret = found
        token = ApiToken.objects.usable().select_related("tenant", "user").filter(key_id=key_id).first()
        if token is None or not tokens.secret_matches(secret, token.key_hash):
            raise exceptions.AuthenticationFailed("Invalid, revoked or inactive token.")
        tokens.touch(token)
        if token.tenant_id is not None:
            return TenantClient(token.tenant, token), token
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'
