"""Staff's view of tenants: each kind's effective limit and its source, overrides inline.

Thin: saving an override (or a tenant's own limit) calls ``actions.reset_buckets_on_commit`` and
says so; the list computes the effective limits from overrides prefetched once for the page.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import Prefetch
from django.template.response import TemplateResponse
from django.utils import timezone

from ankusa_site.core.admin import ModelAdmin
from limits import actions, tokens
from limits.models import OWN_LIMIT_FIELDS, ApiToken, LimitOverride, Tenant
from limits.quotas import EffectiveLimit, effective_limits


class LimitOverrideInline(admin.TabularInline):
    model = LimitOverride
    extra = 0
    fields = ["kind", "rate", "burst", "reason", "expires_at", "set_by", "set_at"]
    readonly_fields = ["set_by", "set_at"]


def scope_words() -> str:
    """Where a limit is counted (``ANKUSA_STORE_SCOPE``), as the tenant's page says it: a node-scope
    limit is per web worker process, so a site of W processes admits up to W times it."""
    if settings.ANKUSA_STORE_SCOPE == "node":
        return (
            "Counted per process (ANKUSA_STORE_SCOPE=node): each web worker process admits this much, "
            "so N worker processes admit up to N times it."
        )
    return (
        "Counted once for every node (ANKUSA_STORE_SCOPE=fleet, in Redis); per process while Redis "
        "does not answer."
    )


def scoped(limit: EffectiveLimit) -> str:
    """``1/s, burst 2 (site default), per process`` with the node store: what one process admits."""
    per_process = limit.limit is not None and settings.ANKUSA_STORE_SCOPE == "node"
    return f"{limit.describe()}{', per process' if per_process else ''}"


@admin.register(Tenant)
class TenantAdmin(ModelAdmin):
    list_display = ["slug", "name", "active", "hooks_limit", "bytes_limit", "created_at"]
    search_fields = ["slug", "name"]
    list_filter = ["active"]
    inlines = [LimitOverrideInline]
    readonly_fields = ["effective_limits_now"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "active", "effective_limits_now"]}),
        (
            "Own limits (empty: the site default applies; an override below wins over both)",
            {"fields": [("hooks_rate", "hooks_burst"), ("bytes_rate", "bytes_burst"), "max_body_bytes"]},
        ),
    ]

    def get_readonly_fields(self, request, obj=None):
        # A slug is fixed once created: webhook URLs, bucket and claim keys hold it.
        return [*super().get_readonly_fields(request, obj), *(["slug"] if obj else [])]

    def has_delete_permission(self, request, obj=None) -> bool:
        # A tenant's commands keep its history (their connectors and deliveries are protected): its
        # delete page would list every one of them, then refuse. Deactivate it instead.
        if obj is not None and obj.commands.exists():
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        found = super().get_actions(request)
        found.pop("delete_selected", None)  # its page would list every command of every tenant chosen
        return found

    def get_queryset(self, request):
        active = LimitOverride.objects.active(timezone.now())
        return (
            super()
            .get_queryset(request)
            .prefetch_related(Prefetch("overrides", queryset=active, to_attr="active_overrides"))
        )

    @admin.display(description="hooks limit")
    def hooks_limit(self, tenant: Tenant) -> str:
        return scoped(effective_limits(tenant)["hooks"])

    @admin.display(description="bytes limit")
    def bytes_limit(self, tenant: Tenant) -> str:
        return scoped(effective_limits(tenant)["bytes"])

    @admin.display(description="effective limits now")
    def effective_limits_now(self, tenant: Tenant) -> str:
        """Each kind's limit that applies at this moment and where it comes from (first match wins:
        an active override, the tenant's own, the site default, unlimited)."""
        if tenant.pk is None:
            return "-"
        parts = []
        for kind, limit in effective_limits(tenant).items():
            text = f"{kind}: {limit.describe()}"
            if limit.override is not None and limit.override.expires_at:
                text += f" until {limit.override.expires_at:%Y-%m-%d %H:%M} UTC"
            parts.append(text)
        return f"{'; '.join(parts)}. {scope_words()}"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and set(OWN_LIMIT_FIELDS) & set(form.changed_data):
            self._reset(request, obj)

    def save_formset(self, request, form, formset, change):
        instances = formset.save(commit=False)
        for override in instances:
            override.set_by = request.user
            override.save()
        for override in formset.deleted_objects:
            override.delete()
        formset.save_m2m()
        if instances or formset.deleted_objects:
            self._reset(request, form.instance)

    def _reset(self, request, tenant: Tenant) -> None:
        actions.reset_buckets_on_commit(tenant)
        self.message_user(
            request,
            f"The buckets of tenant {tenant.slug} were reset: its new limits apply from the next request.",
            messages.INFO,
        )


@admin.register(ApiToken)
class ApiTokenAdmin(ModelAdmin):
    """Tokens are issued here and shown once, on the page that follows; afterwards only their id."""

    list_display = ["name", "shown_as", "tenant", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant", "user"]
    search_fields = ["name", "key_id", "tenant__slug", "user__username"]
    autocomplete_fields = ["tenant", "user"]  # found by slug or username, not typed as an id
    readonly_fields = ["shown_as", "created_at", "last_used_at"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["name", "tenant", "user"]
        return ["name", "shown_as", "tenant", "user", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields + (["tenant", "user"] if obj else [])

    @admin.display(description="token")
    def shown_as(self, token: ApiToken) -> str:
        return tokens.display(token.key_id)

    def save_model(self, request, obj, form, change):
        if not change:
            request._issued_token, obj.key_id, obj.key_hash = tokens.new_key()
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        # Rendered here instead of a redirect with a message, so the plaintext never rides in a
        # cookie or the session: it exists in this one response and nowhere else.
        context = {
            **self.admin_site.each_context(request),
            "title": "Token issued",
            "token": obj,
            "plaintext": request._issued_token,
            "opts": self.opts,
        }
        return TemplateResponse(request, "admin/limits/apitoken/issued.html", context)

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
