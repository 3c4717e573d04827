"""The queue admin shows what the database holds, even a payload no UTF-8 page can carry as it is."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from queues.models import QueueItem


def test_a_stored_lone_surrogate_is_listed_escaped_not_a_500(admin_client):
    # Only the ORM writes one (enqueue refuses it), and only SQLite keeps it.
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL never stores a lone surrogate")
    QueueItem.objects.create(
        queue="jobs", position=1, payload={"note": "a\ud800b"}, enqueued_at=timezone.now()
    )
    response = admin_client.get(reverse("admin:queues_queueitem_changelist"))
    assert response.status_code == 200
    assert "{&quot;note&quot;: &quot;a\\ud800b&quot;}" in response.content.decode()
