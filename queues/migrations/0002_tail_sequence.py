"""The sequence that PostgreSQL takes tail positions from (``queues.backends.database``), started
after the highest position already given. Nothing on other databases."""

from django.db import migrations

SEQUENCE = "queues_queueitem_tail"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"CREATE SEQUENCE {SEQUENCE} AS bigint")
    schema_editor.execute(
        f"SELECT setval('{SEQUENCE}', GREATEST(COALESCE(MAX(position), 0) + 1, 1), false) FROM queues_queueitem"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [("queues", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
