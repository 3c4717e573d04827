"""Admin for connectors, sources, commands and attempts — minimal, correct, and never leaking secrets.

A connector's credential is write-only: the form never renders it, an empty field keeps the one
stored, and lists show only "set" / "not set". A source's signing secrets likewise: a new one is
added to the front of the list, old ones are removed by ticking them (each shown only by position
and a fingerprint keyed with the site's secret key), and the verifier is checked when saved.
Deliveries are history, like attempts. A command's state fields are read-only here,
because a state changes only through ``commands.states`` (the failed-command list with its
actions is a later issue); attempts are history and cannot be added, edited or deleted.
"""

from __future__ import annotations

import hashlib
import hmac

from django import forms
from django.conf import settings
from django.contrib import admin
from django.urls import reverse

from commands import adapters
from commands.models import Attempt, Command, Connector, Delivery, Source


class ConnectorForm(forms.ModelForm):
    secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave empty to keep the stored value.",
    )
    clear_secret = forms.BooleanField(required=False, label="Remove the stored secret")

    class Meta:
        model = Connector
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("clear_secret"):
            cleaned["secret"] = ""
        elif not cleaned.get("secret"):
            cleaned["secret"] = self.instance.secret
        return cleaned


@admin.register(Connector)
class ConnectorAdmin(admin.ModelAdmin):
    form = ConnectorForm
    list_display = ["name", "tenant", "kind", "enabled", "idempotent", "secret_set", "updated_at"]
    list_filter = ["kind", "enabled", "idempotent"]
    list_select_related = ["tenant"]
    search_fields = ["name", "url", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    readonly_fields = ["secret_set", "problems", "updated_at"]
    fieldsets = [
        (None, {"fields": ["tenant", "name", "kind", "enabled", "idempotent", "problems"]}),
        (
            "HTTP",
            {"fields": ["url", "method", "headers", "connect_timeout_s", "read_timeout_s", "status_map"]},
        ),
        ("Credential", {"fields": ["secret_header", "secret_set", "secret", "clear_secret"]}),
        (None, {"fields": ["updated_at"]}),
    ]

    @admin.display(description="secret")
    def secret_set(self, obj: Connector) -> str:
        return "set" if obj.secret else "not set"

    @admin.display(description="problems")
    def problems(self, obj: Connector) -> str:
        if obj.pk is None:
            return "-"
        return "; ".join(adapters.problems(obj)) or "none"


def secret_label(index: int, secret: str) -> str:
    """How staff tell the secrets of a list apart without seeing them: position and a keyed hash."""
    digest = hmac.new(settings.SECRET_KEY.encode(), secret.encode(), hashlib.sha256).hexdigest()[:8]
    return f"#{index + 1}{' (newest)' if index == 0 else ''} · fingerprint {digest}"


class SourceForm(forms.ModelForm):
    # Write-only: the form never renders a stored secret. A new one goes first (newest); ticked
    # ones are removed — rotation is "add the new one, remove the old once the provider uses it".
    verifier_secrets = forms.CharField(
        required=False,
        label="Add a secret",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Becomes the newest of the list; leave empty to keep the list as it is.",
    )
    remove_secrets = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Remove secrets"
    )

    class Meta:
        model = Source
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = self.instance.verifier_secrets or []
        self.fields["remove_secrets"].choices = [(str(i), secret_label(i, s)) for i, s in enumerate(stored)]

    def clean(self):
        cleaned = super().clean()
        tenant, connectors = cleaned.get("tenant"), cleaned.get("connectors")
        if tenant and connectors and any(c.tenant_id != tenant.pk for c in connectors):
            raise forms.ValidationError("A source fans out only to its own tenant's connectors.")
        removed = set(cleaned.get("remove_secrets") or [])
        kept = [s for i, s in enumerate(self.instance.verifier_secrets or []) if str(i) not in removed]
        added = cleaned.get("verifier_secrets")
        cleaned["verifier_secrets"] = ([added] if added else []) + kept
        return cleaned


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    form = SourceForm
    list_display = ["slug", "tenant", "verifier", "secrets_set", "dedupe_key", "needs_approval"]
    list_filter = ["verifier", "needs_approval"]
    list_select_related = ["tenant"]
    search_fields = ["slug", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    filter_horizontal = ["connectors"]
    readonly_fields = ["secrets_set", "hook_url"]
    fieldsets = [
        (None, {"fields": ["tenant", "slug", "hook_url", "connectors", "needs_approval"]}),
        (
            "Signature",
            {"fields": ["verifier", "secrets_set", "verifier_secrets", "remove_secrets", "verifier_options"]},
        ),
        ("Dedupe", {"fields": ["dedupe_key"]}),
    ]

    @admin.display(description="secrets")
    def secrets_set(self, obj: Source) -> str:
        count = len(obj.verifier_secrets or [])
        return f"{count} set" if count else "not set"

    @admin.display(description="webhook URL")
    def hook_url(self, obj: Source) -> str:
        if obj.pk is None:
            return "-"
        return reverse("hook", kwargs={"tenant": obj.tenant.slug, "source": obj.slug})


class HistoryOnly:
    """Attempts are history: shown, never added, changed or deleted here."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


ATTEMPT_COLUMNS = ["number", "started_at", "finished_at", "ok", "outlook", "status_code", "error_class"]


class AttemptInline(HistoryOnly, admin.TabularInline):
    model = Attempt
    fields = [*ATTEMPT_COLUMNS, "error_message"]
    readonly_fields = fields
    extra = 0


STATE_FIELDS = [
    "state",
    "state_changed_at",
    "last_outlook",
    "attempts",
    "next_attempt_at",
    "skip_reason",
    "skip_decided_at",
    "last_error_class",
    "last_error",
    "approved_by",
    "approved_at",
    "resent_from",
    "created_at",
]


@admin.register(Command)
class CommandAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "tenant",
        "connector",
        "state",
        "skip_reason",
        "last_outlook",
        "attempts",
        "next_attempt_at",
        "created_at",
    ]
    list_filter = ["state", "skip_reason", "last_outlook"]
    list_select_related = ["tenant", "connector"]
    search_fields = ["=id", "idempotency_key"]
    raw_id_fields = ["connector", "source", "delivery"]
    autocomplete_fields = ["tenant"]
    show_full_result_count = False
    inlines = [AttemptInline]

    def get_readonly_fields(self, request, obj=None):
        # A new command starts approved (the sweep takes it); after that, only the loop moves it.
        if obj is None:
            return STATE_FIELDS
        return ["tenant", "connector", "source", "delivery", "idempotency_key", "payload", *STATE_FIELDS]

    def get_fields(self, request, obj=None):
        return ["tenant", "connector", "source", "delivery", "idempotency_key", "payload", *STATE_FIELDS]


@admin.register(Attempt)
class AttemptAdmin(HistoryOnly, admin.ModelAdmin):
    list_display = ["command", *ATTEMPT_COLUMNS]
    list_filter = ["ok", "outlook"]
    list_select_related = ["command"]
    raw_id_fields = ["command"]
    show_full_result_count = False


class DeliveryCommandInline(HistoryOnly, admin.TabularInline):
    model = Command
    fields = ["id", "connector", "state", "skip_reason", "attempts"]
    readonly_fields = fields
    show_change_link = True
    extra = 0


@admin.register(Delivery)
class DeliveryAdmin(HistoryOnly, admin.ModelAdmin):
    list_display = ["id", "tenant", "source", "event_key", "size", "received_at"]
    list_select_related = ["tenant", "source"]
    # Exact matches only: the unique (event_key, tenant, source) index serves them, a LIKE would not.
    search_fields = ["=event_key", "=id"]
    show_full_result_count = False
    fields = ["tenant", "source", "event_key", "received_at", "size", "headers", "body"]
    readonly_fields = fields
    inlines = [DeliveryCommandInline]
