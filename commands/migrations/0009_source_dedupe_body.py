"""``Source.dedupe_body``: existing sources keep their behaviour (off); new ones default by verifier."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0008_mask_secrets_in_answers"),
    ]

    operations = [
        # Added as false, which every existing row takes; then made nullable with no default, so a
        # new source left unset is on for GitHub and Shopify (Source.save).
        migrations.AddField(
            model_name="source",
            name="dedupe_body",
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name="source",
            name="dedupe_body",
            field=models.BooleanField(
                null=True,
                blank=True,
                default=None,
                help_text="Also refuse, as a duplicate, a body accepted before within the claim TTL (72 h), "
                "whatever its event id says: for providers that do not sign the id or a timestamp (GitHub, "
                "Shopify), so a captured webhook cannot be replayed under a new id. A provider that "
                "legitimately sends one body twice sees the second deduped. Empty: on for new GitHub and "
                "Shopify sources.",
            ),
        ),
    ]
