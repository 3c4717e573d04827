"""REST endpoints of the limits app, mounted under /api/v1/ by ankusa_site.urls."""

urlpatterns: list = []
