"""REST endpoints of the queues app, mounted under /api/v1/ by ankusa_site.urls."""

urlpatterns: list = []
