"""REST endpoints of the commands app, mounted under /api/v1/ by ankusa_site.urls."""

from rest_framework.routers import SimpleRouter

from commands import api, connector_tools_api

router = SimpleRouter()
router.register("sources", api.SourceViewSet, basename="commands-source")
router.register("connectors", api.ConnectorViewSet, basename="commands-connector")
# A connector's test send and signing secrets: its own actions only, under the same paths.
router.register("connectors", connector_tools_api.ConnectorToolsViewSet, basename="commands-connector-tools")
# POST /commands/ is commands.intake_api.submit, as it was before the viewset took the path over.
router.register("commands", api.CommandViewSet, basename="commands-command")
router.register("deliveries", api.DeliveryViewSet, basename="commands-delivery")
router.register("audit-entries", api.AuditEntryViewSet, basename="commands-auditentry")

urlpatterns = router.urls
