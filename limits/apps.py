from django.apps import AppConfig
from django.core.signals import setting_changed

STORE_SETTINGS = {
    "ANKUSA_STORE_SCOPE",
    "ANKUSA_STORE_TIMEOUT_MS",
    "ANKUSA_FLEET_BREAKER_THRESHOLD",
    "ANKUSA_FLEET_BREAKER_COOLDOWN_MS",
    "REDIS_URL",
}


def _store_setting_changed(setting, **kwargs):
    """Housekeeping for ``override_settings`` in tests: a changed store setting means a new store."""
    if setting in STORE_SETTINGS:
        from limits.store import forget_store

        forget_store()


class LimitsConfig(AppConfig):
    name = "limits"
    verbose_name = "Tenants and limits"

    def ready(self):
        setting_changed.connect(_store_setting_changed, dispatch_uid="limits.store_setting_changed")
