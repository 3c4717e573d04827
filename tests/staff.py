"""Staff people for tests: users in the migration's groups, and API clients holding their tokens."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from limits.models import ApiToken


def staff_user(group: str, username: str | None = None) -> User:
    """A staff user in ``group`` (viewer / operator / admin), read back so no permission is cached."""
    name = username or group
    user = User.objects.create_user(name, f"{name}@example.com", "pw", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


def token_for(user: User) -> str:
    return ApiToken.issue(name=user.username, user=user)[1]


def api_client(user: User) -> APIClient:
    """An API client sending ``user``'s Bearer token."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    return client
