"""REST endpoints of the limits app, mounted under /api/v1/ by ankusa_site.urls."""

from django.urls import path

from limits import api

urlpatterns = [
    path("tenants/", api.TenantList.as_view(), name="limits-tenant-list"),
    path("tenants/<str:slug>/limits/<str:kind>/", api.TenantLimit.as_view(), name="limits-tenant-limit"),
]
