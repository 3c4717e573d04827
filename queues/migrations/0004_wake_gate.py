"""PostgreSQL: a commit that puts rows in main sends ``NOTIFY`` only while a consumer sleeps.

Every ``NOTIFY`` takes one database-wide lock from just before its transaction's commit until
after it, so when every intake commit notified, the commits of the whole site went one at a time,
each with its own WAL flush (issue 23: intake waited on that lock more than on anything else).
Now the wake trigger runs at commit (a deferred constraint trigger) and first tries an
exclusive transaction advisory lock on one of ``STRIPES`` keys (the backend's pid picks it):

* taken — no consumer sleeps: the consumers are draining and look again before they sleep. No
  ``NOTIFY``; the key stays held until the commit is done;
* refused — a consumer sleeps (it holds every stripe shared, ``queues_wake_sleep``), or another
  commit holds the same stripe: ``NOTIFY`` as before.

A consumer about to sleep calls ``queues_wake_sleep(queue)``: it takes every stripe shared (so it
waits for the commits that skipped their notification) and then looks at the queue; it lets go
with ``queues_wake_rise()`` once it wakes (``queues.wake``). Nothing on other databases.
"""

from importlib import import_module

from django.db import migrations

GATE = 1634626421  # the advisory lock's first key: 'anku' in ASCII; the second is the stripe
STRIPES = 32

FUNCTION = f"""
CREATE OR REPLACE FUNCTION queues_queueitem_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock({GATE}, pg_backend_pid() % {STRIPES}) THEN
        PERFORM pg_notify('ankusa_queues', NEW.queue);
    END IF;
    RETURN NULL;
END
$$
"""
TRIGGER = """
CREATE CONSTRAINT TRIGGER queues_queueitem_wake
AFTER INSERT OR UPDATE OF state ON queues_queueitem
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.state = 'main')
EXECUTE FUNCTION queues_queueitem_wake()
"""
# NULL when a stripe stays held past lock_timeout (a commit that queued is slow, or one whose
# constraints were set IMMEDIATE holds it until it ends): the stripes it took are let go, and the
# caller is not gated (it polls meanwhile). Each statement of a
# volatile function reads with a snapshot of its own, so the look sees what committed before it
# got the last stripe.
SLEEP = f"""
CREATE OR REPLACE FUNCTION queues_wake_sleep(wanted text) RETURNS boolean LANGUAGE plpgsql
SET lock_timeout = '100ms' AS $$
DECLARE
    held integer := 0;
BEGIN
    BEGIN
        WHILE held < {STRIPES} LOOP
            PERFORM pg_advisory_lock_shared({GATE}, held);
            held := held + 1;
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        FOR stripe IN 0..held - 1 LOOP
            PERFORM pg_advisory_unlock_shared({GATE}, stripe);
        END LOOP;
        RETURN NULL;
    END;
    RETURN EXISTS (SELECT 1 FROM queues_queueitem WHERE queue = wanted AND state = 'main');
END
$$
"""
RISE = f"""
CREATE OR REPLACE FUNCTION queues_wake_rise() RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_unlock_shared({GATE}, stripe) FROM generate_series(0, {STRIPES - 1}) AS stripe
$$
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP TRIGGER IF EXISTS queues_queueitem_wake ON queues_queueitem")
    for statement in (FUNCTION, TRIGGER, SLEEP, RISE):
        schema_editor.execute(statement, None)  # no parameters: its % is an operator


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP TRIGGER IF EXISTS queues_queueitem_wake ON queues_queueitem")
    schema_editor.execute("DROP FUNCTION IF EXISTS queues_wake_sleep(text)")
    schema_editor.execute("DROP FUNCTION IF EXISTS queues_wake_rise()")
    # Back to migration 0003's trigger: every row that enters main notifies, as it is written.
    import_module("queues.migrations.0003_wake_trigger").create(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("queues", "0003_wake_trigger")]

    operations = [migrations.RunPython(create, drop)]
