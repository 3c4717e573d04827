from django.contrib import admin
from django.urls import path

from ankusa_site import health

admin.site.site_header = "Ankusa"
admin.site.site_title = "Ankusa"
admin.site.index_title = "Operations"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("admin/", admin.site.urls),
]
