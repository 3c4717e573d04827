"""REST endpoints of the limits app, mounted under /api/v1/ by ankusa_site.urls."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from limits import api

router = SimpleRouter()
router.register("tenants", api.TenantViewSet, basename="limits-tenant")

urlpatterns = [
    path("tenants/<str:slug>/limits/<str:kind>/", api.TenantLimit.as_view(), name="limits-tenant-limit"),
    *router.urls,
]
