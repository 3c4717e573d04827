"""The three staff groups and what each may do, created by a migration (``0004_staff_groups``).

* **viewer** sees everything staff can see and changes nothing;
* **operator** also approves, resends (not past the retry guards), cancels, makes new commands
  and fixes connectors and sources;
* **admin** also resends with an override (a non-idempotent connector, an unknown outcome), and
  manages tenants, limits, tokens and queue items.

A person is given a group in the admin (Users → Groups); superusers hold every permission anyway.
:func:`sync` runs after every ``migrate`` too (``CommandsConfig``): it adds what a newer version
grants and never removes a permission given by hand.
"""

from __future__ import annotations

VIEWED = [
    "commands.command",
    "commands.failedcommand",
    "commands.attempt",
    "commands.connector",
    "commands.source",
    "commands.delivery",
    "commands.auditentry",
    "limits.tenant",
    "limits.limitoverride",
    "queues.queueitem",
]

VIEWER = [f"{model.split('.')[0]}.view_{model.split('.')[1]}" for model in VIEWED]
OPERATOR = [
    *VIEWER,
    "commands.approve_command",
    "commands.resend_command",
    "commands.cancel_command",
    "commands.add_command",
    "commands.change_connector",
    "commands.change_source",
]
ADMIN = [
    *OPERATOR,
    "commands.resend_override_command",
    "commands.add_connector",
    "commands.delete_connector",
    "commands.add_source",
    "commands.delete_source",
    "limits.add_tenant",
    "limits.change_tenant",
    "limits.add_limitoverride",
    "limits.change_limitoverride",
    "limits.delete_limitoverride",
    "limits.view_apitoken",
    "limits.add_apitoken",
    "limits.change_apitoken",
    "queues.change_queueitem",
    "queues.delete_queueitem",
]
GROUPS = {"viewer": VIEWER, "operator": OPERATOR, "admin": ADMIN}


def sync(apps) -> None:
    """Create the groups and give them their permissions (``apps``: a migration's app registry, or
    ``django.apps.apps`` — tests that flush the database call it again)."""
    from django.contrib.auth.management import create_permissions

    for config in apps.get_app_configs():
        if getattr(config, "models_module", None) is None:
            # A migration's registry: Django makes permissions only after every migration ran, and
            # skips an app config without a models module; this migration needs them now.
            config.models_module = True
            create_permissions(config, verbosity=0, apps=apps)
            config.models_module = None
        else:
            create_permissions(config, verbosity=0, apps=apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codes in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        wanted = []
        for code in codes:
            app_label, codename = code.split(".")
            wanted.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        group.permissions.add(*wanted)
