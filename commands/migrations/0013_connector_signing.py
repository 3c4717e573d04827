"""A connector's Standard Webhooks signing secrets (a list, all signing: rotation with overlap) and
when its last console test send went out (which paces them)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0012_connector_pacing"),
    ]

    operations = [
        migrations.AddField(
            model_name="connector",
            name="signing_secrets",
            field=models.JSONField(blank=True, default=list, editable=False),
        ),
        migrations.AddField(
            model_name="connector",
            name="tested_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
