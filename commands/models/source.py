"""``Source``: a named way commands arrive for a tenant (``POST /hooks/<tenant>/<source>/``), with
its signature verifier and dedupe key, fanning out only to its own tenant's connectors.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.signals import m2m_changed
from django.dispatch import receiver

from commands.intake import event_keys, signatures
from commands.models.connector import Connector
from commands.states import State
from limits.models import TENANT_FIXED, FixedOnceCreated, Tenant, slug_validator

VERIFIER_LABELS = {
    "none": "none (anyone who knows the URL; private networks only)",
    "github": "GitHub (X-Hub-Signature-256)",
    "stripe": "Stripe (Stripe-Signature, 5-minute timestamp tolerance)",
    "standard": "Standard Webhooks (webhook-id / -timestamp / -signature)",
    "svix": "Svix (svix-id / -timestamp / -signature)",
    "shopify": "Shopify (X-Shopify-Hmac-Sha256)",
    "hmac": "generic HMAC header (options: header, algorithm, encoding, prefix)",
}


VERIFIER_CHOICES = [(kind, VERIFIER_LABELS[kind]) for kind in signatures.VERIFIERS]


# Which column a VerifierConfigError's field ("secrets[1]", "options.tolerance_s") is about. An
# unknown "kind" is not here: the verifier field's choices refuse it already.
VERIFIER_FIELDS = {"secrets": "verifier_secrets", "options": "verifier_options"}


class Source(FixedOnceCreated, models.Model):
    fixed_fields = {"tenant": TENANT_FIXED}

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sources")
    slug = models.CharField(max_length=64, validators=[slug_validator])
    connectors = models.ManyToManyField(Connector, related_name="sources", blank=True)
    needs_approval = models.BooleanField(
        default=False, help_text="Its commands start as drafts that staff approve, instead of approved."
    )
    verifier = models.CharField(
        max_length=16,
        choices=VERIFIER_CHOICES,
        default="none",
        help_text="How a webhook proves it comes from the provider.",
    )
    verifier_secrets = models.JSONField(
        default=list,
        blank=True,
        help_text="The signing secrets, newest first; a signature made with any of them is accepted. "
        "Never shown back.",
    )
    verifier_options = models.JSONField(
        default=dict,
        blank=True,
        help_text='Options of the verifier: {"tolerance_s": 300} for Stripe / Standard Webhooks / Svix; '
        '{"header": "X-Signature", "algorithm": "sha256", "encoding": "hex", "prefix": ""} for hmac.',
    )
    dedupe_key = models.CharField(
        max_length=200,
        blank=True,
        help_text="Where the provider puts the event id, so a redelivery is a duplicate: a preset "
        f"({', '.join(event_keys.PRESETS)}), header:<Name>, json:<dotted.path>, or empty (no dedupe).",
    )
    dedupe_body = models.BooleanField(
        null=True,
        blank=True,
        default=None,
        help_text="Also refuse, as a duplicate, a body accepted before within the claim TTL (72 h), "
        "whatever its event id says: for providers that do not sign the id or a timestamp (GitHub, "
        "Shopify), so a captured webhook cannot be replayed under a new id. A provider that "
        "legitimately sends one body twice sees the second deduped. Empty: on for new GitHub and "
        "Shopify sources.",
    )

    class Meta:
        ordering = ["tenant", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="commands_source_unique_slug"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"  # lists select the tenant with it

    @property
    def initial_state(self) -> State:
        return State.DRAFT if self.needs_approval else State.APPROVED

    @property
    def dedupes_body(self) -> bool:
        """Whether a body accepted before is a duplicate (``dedupe_body``; unset: by verifier)."""
        if self.dedupe_body is None:
            return self.verifier in signatures.UNTIMESTAMPED
        return self.dedupe_body

    def save(self, *args, **kwargs) -> None:
        if self.dedupe_body is None:  # a new source's default, stored so a later change of verifier keeps it
            self.dedupe_body = self.dedupes_body
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "dedupe_body"}
        super().save(*args, **kwargs)

    def build_verifier(self) -> signatures.Verifier:
        """The verifier this source's configuration describes (raises ``VerifierConfigError``)."""
        return signatures.build_verifier(self.verifier, self.verifier_secrets, self.verifier_options)

    def clean(self) -> None:
        errors: dict[str, str] = self.fixed_field_errors()
        try:
            self.build_verifier()
        except signatures.VerifierConfigError as exc:
            column = VERIFIER_FIELDS.get(exc.field.split(".")[0].split("[")[0])
            if column is not None:
                errors[column] = str(exc)  # "secrets[1]: must be base64 ..." names the entry, never its value
        try:
            event_keys.resolve(self.dedupe_key)
        except event_keys.EventKeyConfigError as exc:
            errors["dedupe_key"] = exc.message
        if errors:
            raise ValidationError(errors)


OWN_CONNECTORS_ONLY = "A source fans out only to its own tenant's connectors."


@receiver(m2m_changed, sender=Source.connectors.through, dispatch_uid="commands.source_connectors_own_tenant")
def refuse_other_tenants_connectors(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    """``source.connectors.add()``/``.set()`` (and ``connector.sources.add()``) link only rows of one
    tenant. A signal because a many-to-many add saves no model: this is the only hook every door
    (the admin's form, the API's serializer, the shell) passes through; the first two refuse it in
    their own validation before, with a field error."""
    if action != "pre_add" or not pk_set:
        return
    other = Connector if not reverse else Source
    if other.objects.filter(pk__in=pk_set).exclude(tenant_id=instance.tenant_id).exists():
        raise ValidationError({"connectors": OWN_CONNECTORS_ONLY})
