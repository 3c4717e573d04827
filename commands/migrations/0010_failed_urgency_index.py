"""The failed list's default order (what needs a person first, then oldest first) as an index:
``commands.explain.URGENCY_SQL``, the same text the list orders by, over failed commands only."""

import django.db.models.expressions
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0009_source_dedupe_body"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="command",
            index=models.Index(
                django.db.models.expressions.RawSQL(
                    "CASE WHEN resend_by_id IS NOT NULL THEN 4 WHEN skip_reason IN ('not-idempotent', 'outlook-unknown', 'not-dispatchable') THEN 0 WHEN skip_reason = 'attempts-spent' OR (skip_reason = 'backing-off' AND last_outlook <> 'after-fix' AND attempts >= 3) THEN 1 WHEN last_outlook = 'after-fix' AND skip_reason IN ('', 'backing-off') THEN 2 WHEN skip_reason = 'never' THEN 3 ELSE 4 END",
                    [],
                ),
                models.F("id"),
                condition=models.Q(("state", "failed")),
                name="commands_failed_urgency_idx",
            ),
        ),
    ]
