"""PostgreSQL: every row that enters main (an enqueue, a requeue, an unclaim) sends ``NOTIFY
ankusa_queues, '<queue>'`` from its own transaction, so waiting consumers wake on its commit and
never for a rollback (``queues.wake``). PostgreSQL folds the same notification sent many times in
one transaction into one. Nothing on other databases (they poll)."""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION queues_queueitem_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ankusa_queues', NEW.queue);
    RETURN NULL;
END
$$
"""
TRIGGER = """
CREATE TRIGGER queues_queueitem_wake
AFTER INSERT OR UPDATE OF state ON queues_queueitem
FOR EACH ROW WHEN (NEW.state = 'main')
EXECUTE FUNCTION queues_queueitem_wake()
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION)
    schema_editor.execute(TRIGGER)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP TRIGGER IF EXISTS queues_queueitem_wake ON queues_queueitem")
    schema_editor.execute("DROP FUNCTION IF EXISTS queues_queueitem_wake()")


class Migration(migrations.Migration):
    dependencies = [("queues", "0002_tail_sequence")]

    operations = [migrations.RunPython(create, drop)]
