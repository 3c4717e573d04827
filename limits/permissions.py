"""The one permission class of ``/api/v1/`` (``REST_FRAMEWORK["DEFAULT_PERMISSION_CLASSES"]``):
staff by their Django permissions, tenant tokens by what the view opens to tenants (the view's
``ankusa_site.core.permissions.Access`` declarations).

DRF imports this class while its own ``rest_framework.views`` is still loading, so this module
must not import ``ankusa_site.core.api`` (which imports that one).
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from limits.authentication import tenant_of


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
