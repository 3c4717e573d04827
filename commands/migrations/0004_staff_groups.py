"""The viewer, operator and admin groups (``commands.staff_groups``)."""

from django.db import migrations


def create_groups(apps, schema_editor):
    from commands.staff import staff_groups

    staff_groups.sync(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("commands", "0003_staff_actions_audit"),
        ("limits", "0003_api_token"),
        ("queues", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
