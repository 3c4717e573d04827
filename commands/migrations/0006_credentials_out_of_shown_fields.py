"""Credentials out of the fields the admin and the API show back.

Saving a connector has refused a credential in its plain headers (``Authorization``, ``Cookie``,
``Proxy-Authorization``, ``X-Api-Key``) and a URL with ``user:password@`` only since those rules
were added; rows saved before keep them where every viewer of the connector reads them, and where
the admin's search matches them. This moves each into the write-only secret where it can go:

* a credential header, when the connector has no secret header: it becomes the secret header with
  the same value, so dispatch sends the same request as before;
* the URL's ``user:password@``: the HTTP adapter never sent such a URL (its commands wait as
  after-fix). When the connector has no secret header, it becomes ``Authorization: Basic …``,
  which is what it means (RFC 7617); otherwise the connector's own secret is its credential and the
  URL's is dropped.

A credential header beside a secret header stays where it is: a connector holds one secret, and
dropping the header would change what dispatch sends. Saving such a connector asks a person to
choose. Reversing this migration changes nothing back.
"""

import base64
from urllib.parse import unquote, urlsplit, urlunsplit

from django.db import migrations

CREDENTIAL_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-api-key"}


def move_credentials(apps, schema_editor):
    Connector = apps.get_model("commands", "Connector")
    for connector in Connector.objects.only("url", "headers", "secret_header", "secret").iterator():
        changed = _move_header(connector) | _move_userinfo(connector)
        if changed:
            connector.save(update_fields=["url", "headers", "secret_header", "secret", "updated_at"])


def _move_header(connector) -> bool:
    headers = connector.headers if isinstance(connector.headers, dict) else {}
    name = next((name for name in headers if str(name).lower() in CREDENTIAL_HEADERS), None)
    if name is None or connector.secret_header:
        return False
    connector.secret_header, connector.secret = str(name), str(headers[name])
    connector.headers = {key: value for key, value in headers.items() if key != name}
    return True


def _move_userinfo(connector) -> bool:
    try:
        parts = urlsplit(connector.url or "")
    except ValueError:
        return False
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return False
    connector.url = urlunsplit(parts._replace(netloc=host))
    if not connector.secret_header:
        user, _, password = userinfo.partition(":")
        pair = f"{unquote(user)}:{unquote(password)}".encode()
        connector.secret_header = "Authorization"
        connector.secret = "Basic " + base64.b64encode(pair).decode("ascii")
    return True


class Migration(migrations.Migration):
    dependencies = [
        ("commands", "0005_person_links_and_attempt_time"),
    ]

    operations = [
        migrations.RunPython(move_credentials, migrations.RunPython.noop, elidable=True),
    ]
