"""Credential headers known by the words of their names, out of the connector's shown headers.

Saving a connector refused a credential in its plain headers only under four names
(``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key``; migration 0006 moved
those). It now refuses any header whose name says it carries one (``X-Auth-Token``, ``PrivateToken``,
``DD-API-KEY``, ``X-Hasura-Admin-Secret``, ...: ``models.is_credential_header``),
whose values everyone who may view the connector read. This moves the first such header (by name)
into the write-only secret of a connector that has none, so dispatch sends the same request; one
beside a secret stays, for a person to choose, as in 0006. Reversing changes nothing back.
"""

import re

from django.db import migrations

# A frozen copy of models.is_credential_header.
CREDENTIAL_PARTS = ("token", "secret", "passw", "credential", "apikey", "cookie", "authorization", "bearer")
CREDENTIAL_WORDS = frozenset({"auth", "pwd", "jwt"})
KEY_OF = frozenset(
    {"api", "access", "secret", "private", "subscription", "application", "app", "client", "master",
     "admin", "account", "license", "functions", "auth", "signing", "encryption"}
)  # fmt: skip
NOT_CREDENTIALS = frozenset({"idempotency-key"})


def _is_credential(name: str) -> bool:
    lowered = name.lower()
    if lowered in NOT_CREDENTIALS:
        return False
    if any(part in lowered for part in CREDENTIAL_PARTS):
        return True
    words = re.split(r"[-_.]", lowered)
    return any(word in CREDENTIAL_WORDS for word in words) or any(
        word == "key" and before in KEY_OF for before, word in zip(words, words[1:], strict=False)
    )


def move_credentials(apps, schema_editor):
    Connector = apps.get_model("commands", "Connector")
    for connector in (
        Connector.objects.filter(secret="").only("headers", "secret_header", "secret").iterator()
    ):
        headers = connector.headers if isinstance(connector.headers, dict) else {}
        names = sorted(
            str(name) for name, value in headers.items() if str(value) and _is_credential(str(name))
        )
        if not names:
            continue
        connector.secret_header, connector.secret = names[0], str(headers[names[0]])
        connector.headers = {key: value for key, value in headers.items() if key != names[0]}
        connector.save(update_fields=["headers", "secret_header", "secret", "updated_at"])


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0006_credentials_out_of_shown_fields"),
    ]

    operations = [
        migrations.RunPython(move_credentials, migrations.RunPython.noop, elidable=True),
    ]
