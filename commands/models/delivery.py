"""``Delivery``: one webhook received and stored (the headers it keeps), and the commands made from it."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from commands.models.source import Source
from limits.models import Tenant

# The request headers a delivery keeps: what tells staff which event it was. Signatures are left
# out (useless once verified), and so is everything else a provider or a proxy may add.
KEPT_HEADERS = (
    "Content-Type",
    "User-Agent",
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "X-GitHub-Hook-ID",
    "X-Shopify-Topic",
    "X-Shopify-Shop-Domain",
    "X-Shopify-Webhook-Id",
    "webhook-id",
    "webhook-timestamp",
    "svix-id",
    "svix-timestamp",
)


# A kept header value is cut here: it identifies an event, it is not data.
MAX_KEPT_HEADER_CHARS = 200


class Delivery(models.Model):
    """One webhook received and stored; ``commands`` are the ones made from it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="deliveries")
    source = models.ForeignKey(Source, on_delete=models.PROTECT, related_name="deliveries")
    event_key = models.CharField(
        max_length=255, blank=True, help_text="The provider's event id (empty: the source does not dedupe)."
    )
    headers = models.JSONField(default=dict, blank=True)
    body = models.TextField(blank=True)
    size = models.PositiveIntegerField(help_text="Body bytes.")
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [
            # The last guard against a duplicate: two nodes can never both store one event, whatever
            # the claim store answered. Partial, so deliveries of a source that does not dedupe
            # (empty key) never collide. The key leads, so the index also serves the lookup of the
            # stored original after a refused insert and the admin's search by event id.
            models.UniqueConstraint(
                fields=["event_key", "tenant", "source"],
                condition=~Q(event_key=""),
                name="commands_delivery_unique_event",
            ),
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} ({self.source.slug}: {self.event_key or 'no key'})"
