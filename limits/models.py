"""Tenants: who sends us commands, and how much of them we take.

A tenant's limit for each kind (``hooks``: commands per second, ``bytes``: body bytes per second)
is a rate and a burst. Both fields empty means "no limit of its own": the site default applies,
and without one the tenant is unlimited (see ``limits.effective_limit``).
"""

from __future__ import annotations

from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

SLUG_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
slug_validator = RegexValidator(SLUG_PATTERN, "Use 1 to 64 letters, digits, '-' or '_'.")


class Tenant(models.Model):
    slug = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    hooks_rate = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.000001)], help_text="Commands per second."
    )
    hooks_burst = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Commands admitted at once."
    )
    bytes_rate = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.000001)], help_text="Body bytes per second."
    )
    bytes_burst = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Body bytes admitted at once."
    )
    max_body_bytes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Largest webhook body; empty means the site default."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug
