"""A connector's pacing: its own cap on sends in flight and an optional rate (sends a second),
per dispatch process; empty keeps the site default and no rate."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0011_connector_glance_heartbeat_search"),
    ]

    operations = [
        migrations.AddField(
            model_name="connector",
            name="max_in_flight",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Sends to this receiver in flight at once, per dispatch process. Empty: the site default (ANKUSA_DISPATCH_PER_CONNECTOR).",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(1000),
                ],
            ),
        ),
        migrations.AddField(
            model_name="connector",
            name="max_per_s",
            field=models.FloatField(
                blank=True,
                help_text="At most this many sends a second to this receiver, per dispatch process. Empty: no limit.",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(0.016666666666666666),
                    django.core.validators.MaxValueValidator(10000),
                ],
            ),
        ),
    ]
