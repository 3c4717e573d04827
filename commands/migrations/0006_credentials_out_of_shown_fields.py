"""Credentials out of the fields the admin and the API show back.

Saving a connector has refused a credential in its plain headers (``Authorization``, ``Cookie``,
``Proxy-Authorization``, ``X-Api-Key``) and a URL with ``user:password@`` only since those rules
were added; rows saved before keep them where every viewer of the connector reads them, and where
the admin's search matches them. This moves each into the write-only secret where it can go. A
connector "without a secret" below is one whose secret is empty (a secret header named with no
secret sent nothing: dispatch reported "missing credential").

* a credential header with a value, on a connector without a secret: it becomes the secret header
  with the same value, so dispatch sends the same request as before (when there are several, the
  first of Authorization, X-Api-Key, Proxy-Authorization, Cookie; the others stay, as below);
* the URL's ``user:password@``: the HTTP adapter never sent such a URL (its commands wait as
  after-fix). On a connector without a secret it becomes ``Authorization: Basic …``, which is what
  it means (RFC 7617, the bytes as percent-encoded); otherwise the connector's own secret is its
  credential and the URL's is dropped. An empty ``@`` (no user, no password) is only dropped.

A credential header beside a secret stays where it is: a connector holds one secret, and dropping
the header would change what dispatch sends. Saving such a connector asks a person to choose.
Reversing this migration changes nothing back.
"""

import base64
from urllib.parse import unquote_to_bytes, urlsplit, urlunsplit

from django.db import migrations

# The credential headers, in the order one becomes the secret when a connector has several (its
# stored headers keep no order on PostgreSQL: jsonb sorts keys).
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "proxy-authorization", "cookie")


def move_credentials(apps, schema_editor):
    Connector = apps.get_model("commands", "Connector")
    for connector in Connector.objects.only("url", "headers", "secret_header", "secret").iterator():
        changed = _move_header(connector) | _move_userinfo(connector)
        if changed:
            connector.save(update_fields=["url", "headers", "secret_header", "secret", "updated_at"])


def _move_header(connector) -> bool:
    headers = connector.headers if isinstance(connector.headers, dict) else {}
    present = {str(name).lower(): name for name, value in headers.items() if str(value)}
    name = next((present[kind] for kind in CREDENTIAL_HEADERS if kind in present), None)
    if name is None or connector.secret:
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
    if userinfo and not connector.secret:
        user, _, password = userinfo.partition(":")
        pair = unquote_to_bytes(user) + b":" + unquote_to_bytes(password)
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
