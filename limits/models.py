"""Tenants and their limit overrides: who sends us commands, and how much of them we take.

A tenant's limit for each kind (``hooks``: commands per second, ``bytes``: body bytes per second)
is a rate and a burst (``limits.gcra`` explains both). Where it comes from, first match wins
(``limits.quotas.effective_limit``):

1. an active ``LimitOverride`` (staff set it, with a reason — required — maybe until an
   ``expires_at`` in the future when set);
2. the tenant's own ``<kind>_rate``/``<kind>_burst`` (both set, or both empty);
3. the site default (``ANKUSA_DEFAULT_<KIND>_RATE``/``_BURST``);
4. unlimited.

Changing a limit resets the tenant's buckets (``limits.actions``): otherwise a raised limit would
stay blocked by the debt accrued under the old one. An override that simply expires does not
reset them: the tenant may wait out up to one old window.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from limits.gcra import limit_problems
from limits.tokens import display, new_key

SLUG_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
slug_validator = RegexValidator(SLUG_PATTERN, "Use 1 to 64 letters, digits, '-' or '_'.")


class FixedOnceCreated:
    """A model mixin: the fields named in ``fixed_fields`` keep the value the row was created with.

    Compared with the stored row (one query, only for a row that has a primary key and only when
    a fixed field is written), in :meth:`fixed_field_errors` — which each model's ``clean()`` adds
    to its errors, so the admin and the API answer with a field error — and again in ``save()``,
    which raises ``ValidationError`` for the shell and any code that skips validation. So no door
    moves a row to another tenant or renames a tenant (its slug is in webhook URLs, bucket and
    claim keys). Not covered: ``QuerySet.update()``, which skips ``save()``; the system check
    ``commands.W003`` reports rows joined across tenants.
    """

    fixed_fields: dict[str, str] = {}  # field name -> what a change is answered with

    def fixed_field_errors(self, update_fields=None) -> dict[str, str]:
        if self.pk is None:
            return {}
        fields = [self._meta.get_field(name) for name in self.fixed_fields]
        if update_fields is not None:
            fields = [f for f in fields if f.name in update_fields or f.attname in update_fields]
        if not fields:
            return {}
        stored = type(self)._base_manager.filter(pk=self.pk).values_list(*(f.attname for f in fields)).first()
        if stored is None:  # a new row with a chosen primary key
            return {}
        return {
            f.name: self.fixed_fields[f.name]
            for f, value in zip(fields, stored, strict=True)
            if getattr(self, f.attname) != value
        }

    def save(self, *args, **kwargs):
        errors = self.fixed_field_errors(kwargs.get("update_fields"))
        if errors:
            raise ValidationError(errors)
        super().save(*args, **kwargs)


# What a change of a fixed field is answered with (the API's words).
TENANT_FIXED = "The tenant of an existing row does not change."


class Kind(models.TextChoices):
    HOOKS = "hooks", "commands per second"
    BYTES = "bytes", "body bytes per second"


class LimitSource(models.TextChoices):
    OVERRIDE = "override", "override"
    TENANT = "tenant", "tenant's own"
    DEFAULT = "default", "site default"
    UNLIMITED = "unlimited", "unlimited"


# A tenant's own limits, as its fields are named (``hooks_rate``, ``hooks_burst``, ...): what the
# admin and the API edit, and whose change resets the tenant's buckets.
OWN_LIMIT_FIELDS = tuple(f"{kind}_{part}" for kind in Kind.values for part in ("rate", "burst"))


def _limit_errors(fields: dict[str, str], rate, burst) -> dict[str, str]:
    """Validation errors of one rate/burst pair, keyed by the model's field names."""
    if rate is None or burst is None:
        return {}
    return {fields[name]: message for name, message in limit_problems(rate, burst).items()}


class Tenant(FixedOnceCreated, models.Model):
    fixed_fields = {"slug": "A tenant's slug does not change."}

    slug = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    hooks_rate = models.FloatField(null=True, blank=True, help_text="Commands per second.")
    hooks_burst = models.PositiveIntegerField(null=True, blank=True, help_text="Commands admitted at once.")
    bytes_rate = models.FloatField(null=True, blank=True, help_text="Body bytes per second.")
    bytes_burst = models.PositiveIntegerField(null=True, blank=True, help_text="Body bytes admitted at once.")
    max_body_bytes = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Largest webhook body; empty means the site default.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(hooks_rate__isnull=True, hooks_burst__isnull=True)
                # Spelled out: a CHECK passes when it evaluates to NULL, so "rate > 0" alone lets
                # a rate with a NULL burst through.
                | Q(
                    hooks_rate__isnull=False, hooks_burst__isnull=False, hooks_rate__gt=0, hooks_burst__gte=1
                ),
                name="limits_tenant_hooks_rate_and_burst_together",
            ),
            models.CheckConstraint(
                condition=Q(bytes_rate__isnull=True, bytes_burst__isnull=True)
                | Q(
                    bytes_rate__isnull=False, bytes_burst__isnull=False, bytes_rate__gt=0, bytes_burst__gte=1
                ),
                name="limits_tenant_bytes_rate_and_burst_together",
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    def clean(self):
        errors = self.fixed_field_errors()
        for kind in Kind.values:
            rate, burst = getattr(self, f"{kind}_rate"), getattr(self, f"{kind}_burst")
            if (rate is None) != (burst is None):
                missing = f"{kind}_burst" if burst is None else f"{kind}_rate"
                errors[missing] = f"Set both {kind}_rate and {kind}_burst, or neither."
            errors.update(_limit_errors({"rate": f"{kind}_rate", "burst": f"{kind}_burst"}, rate, burst))
        if errors:
            raise ValidationError(errors)

    def own_limit(self, kind: str) -> tuple[float, int] | None:
        rate, burst = getattr(self, f"{kind}_rate"), getattr(self, f"{kind}_burst")
        return None if rate is None or burst is None else (rate, burst)


class LimitOverrideQuerySet(models.QuerySet):
    def active(self, now):
        """Overrides in force at ``now`` (no expiry, or one still ahead)."""
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))


class LimitOverride(FixedOnceCreated, models.Model):
    """Staff's word on one kind of one tenant's limit, above the tenant's own. One per kind."""

    fixed_fields = {"tenant": TENANT_FIXED}

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="overrides")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    rate = models.FloatField(help_text="Units per second (fractional allowed).")
    burst = models.PositiveIntegerField(help_text="Units at once.")
    reason = models.CharField(max_length=500, blank=True)
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    set_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: until removed.")

    objects = LimitOverrideQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "kind"]
        constraints = [
            # Also the index of the one lookup there is: a tenant's overrides (both kinds at once).
            models.UniqueConstraint(fields=["tenant", "kind"], name="limits_override_one_per_kind"),
            models.CheckConstraint(condition=Q(rate__gt=0), name="limits_override_rate_positive"),
            models.CheckConstraint(condition=Q(burst__gte=1), name="limits_override_burst_positive"),
            models.CheckConstraint(condition=Q(kind__in=Kind.values), name="limits_override_kind_known"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.kind} {self.rate:g}/s burst {self.burst}"

    def clean(self):
        errors = {
            **self.fixed_field_errors(),
            **_limit_errors({"rate": "rate", "burst": "burst"}, self.rate, self.burst),
        }
        # Asked of a new or changed override only: one saved earlier, unchanged beside an edit of its
        # tenant, may have expired since or predate the rule.
        if self._changed():
            if not (self.reason or "").strip():
                errors["reason"] = "Say why the override is needed: it is kept with it and in the history."
            if self.expires_at is not None and self.expires_at <= timezone.now():
                errors["expires_at"] = "Must be in the future (empty: until removed)."
        if errors:
            raise ValidationError(errors)

    def _changed(self) -> bool:
        fields = ("kind", "rate", "burst", "reason", "expires_at")
        stored = LimitOverride.objects.filter(pk=self.pk).values(*fields).first() if self.pk else None
        return stored is None or any(stored[name] != getattr(self, name) for name in fields)


# A token's name is shown in the admin, in its lists and in log lines: no C0/C1 control character
# (tab, CR and LF included), no line or paragraph separator, no lone surrogate (what an argument
# that is not UTF-8 becomes, and no database stores).
TOKEN_NAME_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
TOKEN_NAME_RULE = "A token's name is one line of printable text: no control characters."


class ApiTokenQuerySet(models.QuerySet):
    def usable(self):
        """Tokens that authenticate: not revoked, owner active."""
        return self.filter(revoked_at__isnull=True).filter(Q(tenant__active=True) | Q(user__is_active=True))


class ApiToken(FixedOnceCreated, models.Model):
    """A REST client's credential, for a tenant or a staff user (``limits.tokens`` explains)."""

    fixed_fields = {"tenant": TENANT_FIXED, "user": "The user of an existing token does not change."}

    name = models.CharField(max_length=100, help_text="What uses this token, e.g. 'billing service'.")
    key_id = models.CharField(max_length=12, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="tokens")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(tenant__isnull=False, user__isnull=True)
                | Q(tenant__isnull=True, user__isnull=False),
                name="apitoken_one_owner",
                violation_error_message="A token belongs to a tenant or to a staff user, not both.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({display(self.key_id)})"

    def clean(self):
        # The name's rule is here rather than a field validator, which would need a migration.
        errors = self.fixed_field_errors()
        if TOKEN_NAME_FORBIDDEN.search(self.name or ""):
            errors["name"] = TOKEN_NAME_RULE
        if (self.tenant_id is None) == (self.user_id is None):
            errors[NON_FIELD_ERRORS] = "Choose a tenant or a staff user (exactly one)."
        if errors:
            raise ValidationError(errors)

    @classmethod
    def issue(cls, *, name: str, tenant: Tenant | None = None, user=None) -> tuple[ApiToken, str]:
        """Create a token; the plaintext is returned here and never again."""
        plaintext, key_id, key_hash = new_key()
        token = cls(name=name, tenant=tenant, user=user, key_id=key_id, key_hash=key_hash)
        token.full_clean(exclude=["key_id", "key_hash"])
        token.save()
        return token, plaintext
