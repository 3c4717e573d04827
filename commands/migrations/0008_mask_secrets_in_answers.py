"""The connector's secret masked in the receivers' answers already recorded.

Dispatch has masked the secret in what an attempt keeps of the receiver's answer (its excerpt and
error message) only since ``commands.adapters.send`` does; a receiver that echoed the request's
headers left the credential on the attempt, where staff and the tenant read it. This masks it in
the attempts recorded before, as the adapters' send does now (a frozen copy of its rule: the
secret and its credential after the scheme, as is, JSON-escaped or as Python prints it, and the
start of one where an excerpt was cut). Reversing this migration changes nothing back.
"""

import json

from django.db import migrations
from django.db.models import Q
from django.db.models.functions import Length

MASK = "[redacted]"
MIN_MASKED_CHARS = 4
# What an attempt keeps of an answer at most: an excerpt this long may be cut inside a secret.
EXCERPT_CHARS = 1000


def _forms(secret: str) -> list[str]:
    words = secret.split()
    forms = set()
    for value in {secret, words[-1] if words else secret}:
        forms |= {value, repr(value)[1:-1], ascii(value)[1:-1], json.dumps(value)[1:-1]}
        for encoding in ("latin-1", "utf-8"):
            forms.add(repr(value.encode(encoding, "backslashreplace"))[2:-1])
    return sorted((form for form in forms if len(form) >= MIN_MASKED_CHARS), key=len, reverse=True)


def _masked(text: str, forms: list[str]) -> str:
    for form in forms:
        text = text.replace(form, MASK)
    for form in forms:
        for size in range(len(form) - 1, MIN_MASKED_CHARS - 1, -1):
            if text.endswith(form[:size]):
                return text[:-size] + MASK
    return text


def mask_secrets(apps, schema_editor):
    Connector = apps.get_model("commands", "Connector")
    Attempt = apps.get_model("commands", "Attempt")
    for connector in Connector.objects.exclude(secret="").only("secret").iterator():
        forms = _forms(connector.secret)
        if not forms:
            continue
        quoting = Q()
        for form in forms:
            quoting |= Q(response_excerpt__contains=form) | Q(error_message__contains=form)
        attempts = (
            Attempt.objects.filter(command__connector=connector)
            .annotate(excerpt_chars=Length("response_excerpt"))
            .filter(quoting | Q(excerpt_chars__gte=EXCERPT_CHARS))
            .only("response_excerpt", "error_message")
        )
        for attempt in attempts.iterator():
            excerpt = _masked(attempt.response_excerpt, forms)
            message = _masked(attempt.error_message, forms)
            if (excerpt, message) != (attempt.response_excerpt, attempt.error_message):
                Attempt.objects.filter(pk=attempt.pk).update(response_excerpt=excerpt, error_message=message)


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0007_credential_headers_by_their_words"),
    ]

    operations = [
        migrations.RunPython(mask_secrets, migrations.RunPython.noop, elidable=True),
    ]
