"""The three staff groups and what each may do, created by a migration (``0004_staff_groups``).

* **viewer** sees everything staff can see and changes nothing;
* **operator** also approves, resends (not past the retry guards), cancels, makes new commands,
  fixes connectors and sources, and pauses and resumes connectors;
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
    "commands.pause_connector",
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


# The apps whose permissions the groups hold.
LABELS = sorted({code.split(".")[0] for codes in GROUPS.values() for code in codes})


def sync(apps) -> None:
    """Create the groups and give them their permissions (``apps``: a migration's app registry, or
    the installed apps after a test database's flush)."""
    from django.apps import apps as installed
    from django.contrib.auth.management import create_permissions

    # Django makes permissions after every migration ran; the groups need them now. The installed
    # app config, with ``apps`` for the models, as Django's own post_migrate handler does.
    for label in LABELS:
        create_permissions(installed.get_app_config(label), verbosity=0, apps=apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    found = {
        f"{permission.content_type.app_label}.{permission.codename}": permission
        for permission in Permission.objects.filter(content_type__app_label__in=LABELS).select_related(
            "content_type"
        )
    }
    for name, codes in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        # A permission a later migration makes (pause_connector, 0013) is not there yet when an
        # early migration syncs: the sync after migrate adds it.
        group.permissions.add(*(found[code] for code in codes if code in found))
