"""Admin for connectors and sources — never leaking secrets.

A connector's credential is write-only: the form never renders it, an empty field keeps the one
stored, and lists show only "set" / "not set"; someone who may only view does not get the field at
all (Django would print a read-only field's value). A source's signing secrets likewise: a new one
is added to the front of the list, old ones are removed by ticking them (each shown only by
position and a fingerprint keyed with the site's secret key), and the verifier is checked when
saved. The connector list shows each connector at a glance (``commands.staff.connector_glance``);
a connector or source in use cannot be deleted. A connector's page also sends a test and keeps
its signing secrets (``commands.staff.admin_connector_tools``).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from ankusa_site.core.admin import GuardedChangeList, ModelAdmin
from commands.dispatch import adapters
from commands.models import (
    OWN_CONNECTORS_ONLY,
    Connector,
    Source,
)
from commands.staff import connector_glance, health_admin
from commands.staff.admin_connector_tools import ConnectorTools
from commands.staff.admin_pause import PauseActions
from commands.staff.command_page import moment

SECRET_FIELDS = ["secret", "clear_secret"]


def without_secrets(model_admin, request, obj, fieldsets, secret_fields):
    """The fieldsets minus the write-only fields for someone who may only view: Django shows a
    read-only field's stored value, and a credential is never shown back, to anyone."""
    if model_admin.has_change_permission(request, obj) or (
        obj is None and model_admin.has_add_permission(request)
    ):
        return fieldsets
    return [
        (name, {**options, "fields": [f for f in options["fields"] if f not in secret_fields]})
        for name, options in fieldsets
    ]


class ConnectorChangeList(GuardedChangeList):
    """The connector list, with each page's health read in a fixed number of queries."""

    def get_results(self, request):
        super().get_results(request)
        health_admin.attach(self.result_list)


class DeletableWhileUnused:
    """No delete button for a row its history still points at (commands and deliveries protect
    their connector and source): Django's delete page would list every protecting row, then refuse.
    The bulk delete stays, for unused rows; it refuses used ones the same way."""

    protected_by: tuple[str, ...] = ()

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and any(getattr(obj, name).exists() for name in self.protected_by):
            return False
        return super().has_delete_permission(request, obj)


def failed_list_url(**filters) -> str:
    return reverse("admin:commands_failedcommand_changelist") + "?" + urlencode(filters)


class ConnectorGlance(health_admin.HealthColumns):
    """The connector list's columns and the same figures on its page (``commands.staff.connector_glance``)."""

    @admin.display(description="connector", ordering="tenant__slug")
    def tenant_and_name(self, connector: Connector) -> str:
        return f"{connector.tenant.slug}/{connector.name}"  # the tenant's own column cost the width

    @admin.display(description="URL")
    def short_url(self, connector: Connector) -> str:
        return Truncator(connector.url).chars(40) or "-"

    @admin.display(description="failing", ordering="failing")
    def failing_link(self, connector: Connector):
        return format_html(
            '<a href="{}">{}</a>',
            failed_list_url(connector__id__exact=connector.pk),
            connector_glance.capped(connector.failing),
        )

    @admin.display(description="to go", ordering="waiting")
    def waiting_link(self, connector: Connector):
        url = (
            reverse("admin:commands_command_changelist")
            + "?"
            + urlencode(
                {"connector__id__exact": connector.pk, "state__in": ",".join(connector_glance.WAITING_STATES)}
            )
        )
        return format_html('<a href="{}">{}</a>', url, connector_glance.capped(connector.waiting))

    @admin.display(description="last error", ordering="last_failed_at")
    def last_error_link(self, connector: Connector):
        if connector.last_failed_at is None:
            return "-"
        return format_html(
            '<a href="{}"><code>{}</code> {}</a> <span class="ankusa-when">{}</span>',
            failed_list_url(
                connector__id__exact=connector.pk, last_error_class=connector.last_error_class or ""
            ),
            connector.last_error_class or "?",
            Truncator(connector.last_error or "").chars(32),
            moment(connector.last_failed_at),
        )

    @admin.display(description="at a glance")
    def glance(self, connector: Connector):
        if connector.pk is None:
            return "-"
        connector = connector_glance.annotate(Connector.objects.filter(pk=connector.pk)).get()
        health_admin.attach([connector])
        return format_html(
            '<table class="ankusa-glance"><tr><th>success, 24 h</th><td>{}</td></tr>'
            "<tr><th>failing</th><td>{}</td></tr><tr><th>waiting to go</th><td>{}</td></tr>"
            "<tr><th>last error</th><td>{}</td></tr></table>{}",
            self.success_rate(connector),
            self.failing_link(connector),
            self.waiting_link(connector),
            self.last_error_link(connector),
            health_admin.page_table(connector),
        )


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
class ConnectorAdmin(ConnectorTools, PauseActions, DeletableWhileUnused, ConnectorGlance, ModelAdmin):
    """Connectors, each with how it has been doing (``connector_glance``): a few annotations and one
    query per page, whatever the number of commands."""

    form = ConnectorForm
    protected_by = ("commands",)
    list_display = [
        "tenant_and_name",
        "short_url",
        "idempotent",
        "sending",
        "health_rates",
        "health_send_time",
        "health_run",
        "failing_link",
        "health_waiting",
        "waiting_link",
        "last_error_link",
    ]
    list_filter = ["kind", "enabled", "idempotent"]
    list_select_related = ["tenant", "paused_by"]
    search_fields = ["name", "url", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    readonly_fields = ["secret_set", "problems", "glance", "sending", "updated_at"]
    fieldsets = [
        (
            None,
            {"fields": ["tenant", "name", "kind", "enabled", "idempotent", "sending", "problems", "glance"]},
        ),
        (
            "HTTP",
            {"fields": ["url", "method", "headers", "connect_timeout_s", "read_timeout_s", "status_map"]},
        ),
        ("Credential", {"fields": ["secret_header", "secret_set", "secret", "clear_secret"]}),
        ("Pacing, per dispatch process", {"fields": ["max_in_flight", "max_per_s", "hold_after_failures"]}),
        (None, {"fields": ["updated_at"]}),
    ]

    def get_fieldsets(self, request, obj=None):
        return without_secrets(self, request, obj, super().get_fieldsets(request, obj), SECRET_FIELDS)

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), *(["tenant"] if obj else [])]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        # What the save did to its waiting commands (Connector.save decided again on them).
        reconsidered = getattr(obj, "reconsidered", None)
        if reconsidered is not None and (reconsidered.going or reconsidered.parked):
            self.message_user(request, reconsidered.summary(), messages.INFO)

    def get_queryset(self, request):
        return connector_glance.annotate(super().get_queryset(request))

    def get_changelist(self, request, **kwargs):
        return ConnectorChangeList

    @admin.display(description="stored secret")
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


class ByVerifierSelect(forms.NullBooleanSelect):
    """Yes / No, and for a new source the default named for what it is."""

    def __init__(self, attrs=None):
        super().__init__(attrs)
        self.choices = [
            ("unknown", "By verifier: on for GitHub and Shopify"),
            ("true", "Yes"),
            ("false", "No"),
        ]


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
        widgets = {"dedupe_body": ByVerifierSelect}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = self.instance.verifier_secrets or []
        self.fields["remove_secrets"].choices = [(str(i), secret_label(i, s)) for i, s in enumerate(stored)]

    def clean(self):
        cleaned = super().clean()
        # On change the tenant is read-only (not in the form): the stored one.
        tenant_id = cleaned["tenant"].pk if cleaned.get("tenant") else self.instance.tenant_id
        connectors = cleaned.get("connectors")
        if tenant_id and connectors and any(c.tenant_id != tenant_id for c in connectors):
            raise forms.ValidationError(OWN_CONNECTORS_ONLY)
        removed = set(cleaned.get("remove_secrets") or [])
        kept = [s for i, s in enumerate(self.instance.verifier_secrets or []) if str(i) not in removed]
        added = cleaned.get("verifier_secrets")
        cleaned["verifier_secrets"] = ([added] if added else []) + kept
        return cleaned


@admin.register(Source)
class SourceAdmin(DeletableWhileUnused, ModelAdmin):
    form = SourceForm
    protected_by = ("commands", "deliveries")
    list_display = ["slug", "tenant", "verifier", "secrets_set", "dedupe_key", "needs_approval"]
    list_filter = ["verifier", "needs_approval"]
    list_select_related = ["tenant"]
    search_fields = ["slug", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    filter_horizontal = ["connectors"]

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if db_field.name == "connectors":  # each is named tenant/name: one query, not one per connector
            kwargs["queryset"] = Connector.objects.select_related("tenant")
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    readonly_fields = ["secrets_set", "hook_url"]
    fieldsets = [
        (None, {"fields": ["tenant", "slug", "hook_url", "connectors", "needs_approval"]}),
        (
            "Signature",
            {"fields": ["verifier", "secrets_set", "verifier_secrets", "remove_secrets", "verifier_options"]},
        ),
        ("Dedupe", {"fields": ["dedupe_key", "dedupe_body"]}),
    ]

    def get_fieldsets(self, request, obj=None):
        return without_secrets(
            self, request, obj, super().get_fieldsets(request, obj), ["verifier_secrets", "remove_secrets"]
        )

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), *(["tenant"] if obj else [])]

    @admin.display(description="secrets")
    def secrets_set(self, obj: Source) -> str:
        count = len(obj.verifier_secrets or [])
        return f"{count} set" if count else "not set"

    @admin.display(description="webhook URL")
    def hook_url(self, obj: Source) -> str:
        if obj.pk is None:
            return "-"
        return reverse("hook", kwargs={"tenant": obj.tenant.slug, "source": obj.slug})
