"""The fences around the site's fast paths: ``ANKUSA_STOCK_DJANGO`` turns each back to stock Django.

Four layers go faster than Django's own way, and each keeps that way as its reference:

* ``handler`` — webhooks past the URL resolver and most middleware (``ankusa_site.handlers``);
  stock: Django's ``WSGIHandler`` for every request;
* ``prepared`` — statements prepared on the server (``ankusa_site.core.prepared``); stock: the same
  statement through Django's cursor, bound on the client;
* ``sql`` — hand-written statements where the ORM's compilation costs more than the database's work
  (intake's one-statement write and ``insert``, dispatch's start, finish, attempt rows and loading,
  the database queue's enqueue, claim and done); stock: the ORM's queries they stand for
  (``queues.backends.database_stock`` for the queue's);
* ``backend`` — the site's database backends (``ankusa_site.postgresql``, ``ankusa_site.sqlite3``);
  stock: ``django.db.backends.postgresql`` / ``sqlite3``.

One setting with the layers named, rather than one setting per layer: ``1`` (or ``all``) is the
whole stock site that the test suite holds every fast path to, and a list (``handler,sql``) lets
the benchmark price each layer alone. Unset, ``0`` or empty: every fast path on. An unknown name
fails the boot. Read once, at settings time; a process never changes its mind.

What stock mode does not change: what is stored, answered or sent — only how (the tests run the
intake, dispatch and database-queue suites in both modes to hold that).
"""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

LAYERS = ("handler", "prepared", "sql", "backend")
STOCK_ENGINES = {
    "ankusa_site.postgresql": "django.db.backends.postgresql",
    "ankusa_site.sqlite3": "django.db.backends.sqlite3",
}


def parse(value: str | None, name: str = "ANKUSA_STOCK_DJANGO") -> frozenset[str]:
    """The layers ``value`` turns back to stock Django."""
    text = (value or "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return frozenset()
    if text in ("1", "true", "yes", "on", "all"):
        return frozenset(LAYERS)
    named = {item.strip() for item in text.split(",") if item.strip()}
    unknown = sorted(named - set(LAYERS))
    if unknown:
        raise ImproperlyConfigured(
            f"{name}={value!r}: {', '.join(unknown)} is no layer; use 1 (all), or some of: {', '.join(LAYERS)}."
        )
    return frozenset(named)


def stock_engine(database: Mapping, layers: frozenset[str]) -> dict:
    """``database`` (a ``DATABASES`` entry) with Django's own engine when ``backend`` is stock."""
    if "backend" not in layers:
        return dict(database)
    return {**database, "ENGINE": STOCK_ENGINES.get(database["ENGINE"], database["ENGINE"])}


def stock(layer: str) -> bool:
    """Whether ``layer`` runs Django's stock way in this process."""
    from django.conf import settings

    return layer in settings.ANKUSA_STOCK_DJANGO
