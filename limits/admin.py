from django.contrib import admin

from limits.models import Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "active", "created_at"]
    search_fields = ["slug", "name"]
    list_filter = ["active"]
