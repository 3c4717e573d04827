"""Staff's view of tenants: each kind's effective limit and its source, overrides inline.

Thin: saving an override (or a tenant's own limit) calls ``actions.reset_buckets_on_commit`` and
says so; the list computes the effective limits from overrides prefetched once for the page.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Prefetch
from django.utils import timezone

from limits import actions
from limits.models import Kind, LimitOverride, Tenant
from limits.quotas import effective_limits

LIMIT_FIELDS = {f"{kind}_{part}" for kind in Kind.values for part in ("rate", "burst")}


class LimitOverrideInline(admin.TabularInline):
    model = LimitOverride
    extra = 0
    fields = ["kind", "rate", "burst", "reason", "expires_at", "set_by", "set_at"]
    readonly_fields = ["set_by", "set_at"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "active", "hooks_limit", "bytes_limit", "created_at"]
    search_fields = ["slug", "name"]
    list_filter = ["active"]
    inlines = [LimitOverrideInline]
    fieldsets = [
        (None, {"fields": ["slug", "name", "active"]}),
        (
            "Own limits (empty: the site default applies; an override below wins over both)",
            {"fields": [("hooks_rate", "hooks_burst"), ("bytes_rate", "bytes_burst"), "max_body_bytes"]},
        ),
    ]

    def get_queryset(self, request):
        active = LimitOverride.objects.active(timezone.now())
        return (
            super()
            .get_queryset(request)
            .prefetch_related(Prefetch("overrides", queryset=active, to_attr="active_overrides"))
        )

    @admin.display(description="hooks limit")
    def hooks_limit(self, tenant: Tenant) -> str:
        return effective_limits(tenant)["hooks"].describe()

    @admin.display(description="bytes limit")
    def bytes_limit(self, tenant: Tenant) -> str:
        return effective_limits(tenant)["bytes"].describe()

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and LIMIT_FIELDS & set(form.changed_data):
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
