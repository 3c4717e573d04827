"""REST endpoints of the commands app, mounted under ``/api/v1/`` by ``ankusa_site.urls``: sources and
connectors (``api_connectors``), commands and their staff actions (``api_commands``, shapes in
``api_command_io``), deliveries and audit entries (``api_history``), on the tenant-scoping bases of
``api_base``.

Who may do what is ``limits.permissions.ApiPermission``: staff by their Django permissions (the
viewer / operator / admin groups of ``commands.staff.staff_groups``), tenant tokens read their own
tenant's rows only (another tenant's row is a 404, exactly like a missing one) and submit
commands; they never run a staff action, never read audit entries.

* Credentials are write-only: a connector's ``secret`` and a source's ``verifier_secrets`` are
  accepted on write and never returned; ``secret_set`` / ``secrets_set`` say whether (how many).
  A delivery never shows a signature header (the intake keeps none; the filter here is a second
  guard).
* ``POST /commands/`` is ``commands.intake.rest.submit`` unchanged (quota, dedupe, queue).
* The staff actions (``approve``, ``resend``, ``cancel`` on one command or in bulk, and
  ``new-command``) parse their input, check the action's permission and call one function of
  ``commands.staff.actions``, which holds the guards, the compare-and-set and the audit row; a dry run
  answers its plan and writes nothing.
* Big lists (commands, deliveries, attempts, audit) are cursor pages: no COUNT over the table,
  and the cost of a page does not grow with the table (see the query-count test).
* A connector's test send and signing secrets are ``api_connector_tools`` (``commands.staff.connector_tools``).
* Ids are 64-bit: a path or filter id past 2**63-1 is a 404 or a 400 before it reaches the database.
"""

from rest_framework.routers import SimpleRouter

from commands.staff.api_commands import CommandViewSet
from commands.staff.api_connector_tools import ConnectorToolsViewSet
from commands.staff.api_connectors import ConnectorViewSet, SourceViewSet
from commands.staff.api_history import AuditEntryViewSet, DeliveryViewSet

router = SimpleRouter()
router.register("sources", SourceViewSet, basename="commands-source")
router.register("connectors", ConnectorViewSet, basename="commands-connector")
# A connector's test send and signing secrets: its own actions only, under the same paths.
router.register("connectors", ConnectorToolsViewSet, basename="commands-connector-tools")
# POST /commands/ is commands.intake.rest.submit, as it was before the viewset took the path over.
router.register("commands", CommandViewSet, basename="commands-command")
router.register("deliveries", DeliveryViewSet, basename="commands-delivery")
router.register("audit-entries", AuditEntryViewSet, basename="commands-auditentry")

urlpatterns = router.urls
