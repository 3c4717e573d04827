"""System checks for rules that span several settings.

Each rule here would otherwise surface as a wrong behaviour at run time, not an error: a
visibility timeout shorter than a send lets the recovery hand an in-flight command to a second
worker (a double send), a pending claim that outlives the committed one turns a duplicate into
a lost webhook. ``manage.py check`` (and every ``migrate``/``runserver``) reports them at boot.
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register

from commands.dispatch.adapters.http import longest_send_s


@register()
def check_ankusa_settings(app_configs, **kwargs):
    problems = []
    if settings.ANKUSA_CLAIM_PENDING_TTL_MS >= settings.ANKUSA_CLAIM_TTL_MS:
        problems.append(
            Error(
                "ANKUSA_CLAIM_PENDING_TTL_MS must be shorter than ANKUSA_CLAIM_TTL_MS.",
                hint="A pending claim is a commit in flight (seconds); a committed one guards against "
                "a provider's retries (days).",
                id="ankusa.E001",
            )
        )
    longest_send = longest_send_s()
    if settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S <= longest_send:
        problems.append(
            Error(
                f"ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S ({settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S}) must be "
                f"longer than a whole HTTP send ({longest_send:g} s of connect + read timeout).",
                hint="Otherwise the recovery hands a command still being sent to another worker.",
                id="ankusa.E002",
            )
        )
    for kind in ("HOOKS", "BYTES"):
        rate = getattr(settings, f"ANKUSA_DEFAULT_{kind}_RATE")
        burst = getattr(settings, f"ANKUSA_DEFAULT_{kind}_BURST")
        if (rate is None) != (burst is None):
            problems.append(
                Error(
                    f"ANKUSA_DEFAULT_{kind}_RATE and ANKUSA_DEFAULT_{kind}_BURST must be set together.",
                    id="ankusa.E003",
                )
            )
    if settings.ANKUSA_DISPATCH_PER_CONNECTOR > settings.ANKUSA_DISPATCH_CONCURRENCY:
        problems.append(
            Warning(
                "ANKUSA_DISPATCH_PER_CONNECTOR is larger than ANKUSA_DISPATCH_CONCURRENCY; "
                "the pool size is the effective cap.",
                id="ankusa.W001",
            )
        )
    return problems
