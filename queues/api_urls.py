"""REST endpoints of the queues app, mounted under /api/v1/ by ankusa_site.urls."""

from django.urls import path

from queues import api

urlpatterns = [
    path("queues/", api.QueueList.as_view(), name="queues-list"),
    path("queues/<str:name>/", api.QueueDetail.as_view(), name="queues-detail"),
    path("queues/<str:name>/requeue-failed/", api.RequeueFailed.as_view(), name="queues-requeue-failed"),
    path("queues/<str:name>/remove-failed/", api.RemoveFailed.as_view(), name="queues-remove-failed"),
]
