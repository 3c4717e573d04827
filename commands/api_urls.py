"""REST endpoints of the commands app, mounted under /api/v1/ by ankusa_site.urls."""

urlpatterns: list = []
