"""The console's round two: who dispatches (``DispatcherHeartbeat``), the connector list's indexes,
and the payload search's trigram index.

The trigram index exists on PostgreSQL only (``pg_trgm``, a trusted extension since PostgreSQL 13:
the database's owner may create it). Its expression is the one ``commands.search`` filters on,
``UPPER(payload::text)``, so a case-insensitive substring search of the payload ("A-1042", an order
number) reads the index instead of every row. SQLite has no such index: its search scans a bounded
range of the newest commands instead (``commands.search``).
"""

from django.db import migrations, models

PAYLOAD_INDEX = "commands_payload_trgm_idx"


def create_payload_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {PAYLOAD_INDEX} ON commands_command "
        "USING gin (UPPER((payload)::text) gin_trgm_ops)"
    )


def drop_payload_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {PAYLOAD_INDEX}")  # the extension may serve others


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0010_failed_urgency_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="DispatcherHeartbeat",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(help_text="host:pid of the process.", max_length=200, unique=True)),
                (
                    "kind",
                    models.CharField(
                        choices=[("loop", "dispatch loop"), ("celery", "Celery worker")], max_length=8
                    ),
                ),
                ("started_at", models.DateTimeField(help_text="Its first round.")),
                ("last_round_at", models.DateTimeField(db_index=True)),
                ("rounds", models.PositiveBigIntegerField(default=1)),
            ],
            options={
                "ordering": ["-last_round_at"],
            },
        ),
        migrations.AddIndex(
            model_name="command",
            index=models.Index(
                condition=models.Q(("state", "failed")),
                fields=["connector", "-state_changed_at"],
                name="commands_connector_failed_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="command",
            index=models.Index(
                condition=models.Q(("state__in", ["approved", "queued"])),
                fields=["connector"],
                name="commands_connector_waiting_idx",
            ),
        ),
        migrations.RunPython(create_payload_index, drop_payload_index),
    ]
