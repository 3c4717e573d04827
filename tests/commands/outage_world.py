"""What the outage tests set up in a database of a private PostgreSQL cluster (not the test's own),
run as ``python -m tests.commands.outage_world <receiver url> <count> [--sweep]`` with that
cluster's ``DATABASE_URL``: a tenant, a connector (not idempotent) to the receiver, and ``count``
approved commands — queued with their items, as intake leaves them, with ``--sweep``."""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from commands.dispatch.sweep import sweep
    from commands.models import Command, Connector
    from limits.models import Tenant

    url, count = argv[0], int(argv[1])
    tenant, _ = Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme"})
    connector, _ = Connector.objects.get_or_create(
        tenant=tenant, name="receiver", defaults={"kind": "http", "url": url}
    )
    for n in range(count):
        Command.objects.create(tenant=tenant, connector=connector, payload={"n": n})
    if "--sweep" in argv:
        print(f"queued {sweep().taken}")


if __name__ == "__main__":
    main(sys.argv[1:])
