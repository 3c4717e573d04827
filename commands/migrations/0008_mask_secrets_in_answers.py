"""The connector's secret masked in the receivers' answers already recorded.

Dispatch has masked the secret in what an attempt keeps of the receiver's answer (its excerpt and
error message) only since ``commands.adapters.send`` does; a receiver that echoed the request's
headers left the credential on the attempt, where staff and the tenant read it. This masks it in
the attempts recorded before, as the adapters' send does now (a frozen copy of its rule: the
secret and its credential after the scheme, as is, as Python prints it, JSON-escaped as the common
encoders do it, percent-encoded or HTML-escaped, and the start of one where a text was cut). Reversing this migration changes nothing back.
"""

import html
import json
from urllib.parse import quote, quote_plus

from django.db import migrations
from django.db.models import Q
from django.db.models.functions import Length

MASK = "[redacted]"
MIN_MASKED_CHARS = 4
# What an attempt keeps of an answer at most (bytes): a text this long may be cut inside a secret.
EXCERPT_CHARS = 1000
_ESCAPES = (("<>&", "\\u{:04x}"), ("<>&+'`", "\\u{:04X}"), ("/", "\\{}"))


def _forms(secret: str) -> list[str]:
    words = secret.split()
    forms = set()
    for value in {secret, words[-1] if words else secret}:
        as_json = json.dumps(value)[1:-1]
        forms |= {value, repr(value)[1:-1], ascii(value)[1:-1], as_json}
        forms |= {quote(value, safe=""), quote_plus(value), html.escape(value)}
        for encoding in ("latin-1", "utf-8"):
            forms.add(repr(value.encode(encoding, "backslashreplace"))[2:-1])
        for escaped, escape in _ESCAPES:
            forms.add(
                "".join(escape.format(ord(c) if "u" in escape else c) if c in escaped else c for c in as_json)
            )
    return sorted((form for form in forms if len(form) >= MIN_MASKED_CHARS), key=len, reverse=True)


def _masked(text: str, forms: list[str]) -> str:
    for form in forms:
        text = text.replace(form, MASK)
    if len(text.encode("utf-8", "surrogatepass")) < EXCERPT_CHARS - 3:
        return text
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
        # A text cut at EXCERPT_CHARS bytes holds at least a quarter as many characters.
        long_enough = Q(excerpt_chars__gte=EXCERPT_CHARS // 4) | Q(message_chars__gte=EXCERPT_CHARS // 4)
        attempts = (
            Attempt.objects.filter(command__connector=connector)
            .annotate(excerpt_chars=Length("response_excerpt"), message_chars=Length("error_message"))
            .filter(quoting | long_enough)
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
