"""Who may do what under ``/api/v1/``: one permission class, and what each view declares for it.

Kept apart from ``ankusa_site.api``: DRF imports the default permission class while its own
``rest_framework.views`` is still loading, so this module must not import that one.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from limits.authentication import tenant_of

# A view's HTTP method -> the Django permission verb it needs from staff.
VERBS = {"GET": "view", "HEAD": "view", "OPTIONS": "view", "POST": "add", "PUT": "change",
         "PATCH": "change", "DELETE": "delete"}  # fmt: skip


class ApiPermission(BasePermission):
    """The one permission scheme of ``/api/v1/``.

    * **Anonymous**: 401 (the authenticator's ``WWW-Authenticate`` makes DRF answer 401, not 403).
    * **Staff** (token or session, active and ``is_staff``): the Django permissions the view names
      for this request (:meth:`Access.required_permissions`): ``view_*`` to read, ``add/change/
      delete_*`` to write, the action's own permission for a staff action. Superusers hold them all.
    * **Tenant tokens**: only what the view opens to tenants (``tenant_reads``, ``tenant_actions``),
      and the view scopes its rows to the token's tenant, so another tenant's object is a 404
      exactly like a missing one. Never a staff action, never queues or audit entries (403).
    * Any other authenticated user (a token of a user who is not staff): 403.
    """

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if not hasattr(view, request.method.lower()):
            return True  # no such method here: the view answers 405, whoever asks
        if tenant_of(user) is not None:
            return view.tenant_may(request)
        if not (user.is_active and user.is_staff):
            return False
        return user.has_perms(view.required_permissions(request))


class Access:
    """What a view declares for :class:`ApiPermission` (mixed into every API view)."""

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
