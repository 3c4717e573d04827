"""What each ``/api/v1/`` view declares about who may use it (``Access``), read by the one
permission class, ``limits.permissions.ApiPermission`` (which knows tenants, so it lives with them).

Kept apart from ``ankusa_site.core.api``: DRF imports the default permission class while its own
``rest_framework.views`` is still loading, so the chain from that class must not import that one.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS

# A view's HTTP method -> the Django permission verb it needs from staff.
VERBS = {"GET": "view", "HEAD": "view", "OPTIONS": "view", "POST": "add", "PUT": "change",
         "PATCH": "change", "DELETE": "delete"}  # fmt: skip


class Access:
    """What a view declares for ``limits.permissions.ApiPermission`` (mixed into every API view)."""

    #: "app.model" whose view/add/change/delete permissions guard the plain methods.
    permission_model: str = ""
    #: viewset action (or HTTP method) -> the permissions it needs instead of the verb's.
    action_permissions: dict[str, tuple[str, ...]] = {}
    #: Tenant tokens may read (GET/HEAD/OPTIONS) this view, scoped to their tenant.
    tenant_reads: bool = False
    #: Viewset actions a tenant token may run besides reading (e.g. submitting a command).
    tenant_actions: tuple[str, ...] = ()

    def current_action(self, request) -> str:
        return getattr(self, "action", None) or request.method.lower()

    def required_permissions(self, request) -> tuple[str, ...]:
        action = self.current_action(request)
        if action in self.action_permissions:
            return self.action_permissions[action]
        app_label, model = self.permission_model.split(".")
        return (f"{app_label}.{VERBS.get(request.method, 'change')}_{model}",)

    def tenant_may(self, request) -> bool:
        if self.current_action(request) in self.tenant_actions:
            return True
        return self.tenant_reads and request.method in SAFE_METHODS
