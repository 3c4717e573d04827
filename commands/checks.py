"""System checks for rows saved before a rule of the model layer existed.

The rules hold for every row saved since (``Connector.clean``/``save``, ``Source.save``, the link
guard of ``Source.connectors``); rows stored before them, or written by ``QuerySet.update()``,
are listed here by ``manage.py check`` (and every management command that runs the checks), so a
person can fix them:

* ``commands.W001``: a connector whose URL names an address it may not reach (a literal address or
  a name that always means one; names are not resolved here, every send resolves and checks them);
* ``commands.W002``: a connector whose headers set one a send leaves out (framing, hop-by-hop, or
  set by the send itself);
* ``commands.W003``: rows joined across tenants: a source fanning out to another tenant's connector,
  a command or delivery whose tenant is not its connector's or source's.

A database that cannot be read (not migrated yet, not reachable) is not a finding: nothing is
reported then.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.core.checks import Warning
from django.db import DatabaseError
from django.db.models import F

from commands.dispatch.adapters import egress
from commands.dispatch.adapters.http import reserved_header_problem

# A warning lists this many rows, then says how many more there are.
LISTED = 20


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _unreachable(url: str) -> str | None:
    try:
        hostname = urlsplit(url or "").hostname
    except ValueError:
        return None
    problem = egress.known_problem(hostname) if hostname else None
    return problem.removesuffix(f" ({egress.HINT})") if problem else None


def check_connectors(app_configs, **kwargs) -> list[Warning]:
    from commands.models import Command, Connector, Delivery, Source

    try:
        connectors = list(
            Connector.objects.select_related("tenant")
            .only("name", "url", "headers", "tenant__slug")
            .filter(kind="http")
        )
        links = list(
            Source.connectors.through.objects.exclude(source__tenant=F("connector__tenant"))
            .order_by("pk")
            .values_list(
                "source__tenant__slug", "source__slug", "connector__tenant__slug", "connector__name"
            )[: LISTED + 1]
        )
        commands = Command.objects.exclude(tenant=F("connector__tenant")) | Command.objects.filter(
            source__isnull=False
        ).exclude(tenant=F("source__tenant"))
        command_ids = list(commands.order_by("pk").values_list("pk", flat=True)[: LISTED + 1])
        delivery_ids = list(
            Delivery.objects.exclude(tenant=F("source__tenant"))
            .order_by("pk")
            .values_list("pk", flat=True)[: LISTED + 1]
        )
    except DatabaseError:
        return []
    found = []
    unreachable = [
        f"{c.tenant.slug}/{c.name} ({problem})" for c in connectors if (problem := _unreachable(c.url))
    ]
    if unreachable:
        found.append(
            Warning(
                f"{_plural(len(unreachable), 'connector')} may not reach its URL: {_listed(unreachable)}; "
                "its sends fail as after-fix.",
                hint="Point it at a public address, or open the network it needs in "
                "ANKUSA_CONNECTOR_ALLOWED_NETWORKS.",
                id="commands.W001",
            )
        )
    framing = []
    for c in connectors:
        names = [str(n) for n in (c.headers or {}) if reserved_header_problem(str(n))]
        if names:
            framing.append(f"{c.tenant.slug}/{c.name} ({', '.join(names)})")
    if framing:
        found.append(
            Warning(
                f"{_plural(len(framing), 'connector')} sets headers a send leaves out: {_listed(framing)}.",
                hint="Remove them from the connector's headers: they are framing or hop-by-hop headers, "
                "or ones every send sets itself.",
                id="commands.W002",
            )
        )
    rows = [
        f"{s_tenant}/{source} -> {c_tenant}/{connector}" for s_tenant, source, c_tenant, connector in links
    ]
    rows += [f"command {pk}" for pk in command_ids] + [f"delivery {pk}" for pk in delivery_ids]
    if rows:
        found.append(
            Warning(
                f"Rows joined across tenants: {_listed(rows)}.",
                hint="A source fans out only to its own tenant's connectors, and a command or delivery "
                "belongs to its connector's and source's tenant: remove the link, or cancel the command.",
                id="commands.W003",
            )
        )
    return found
