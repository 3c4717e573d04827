"""Read configuration from the environment, failing loudly on a bad value.

Every setting of the site comes through one of these helpers, so a typo in a deployment
(``ANKUSA_STORE_TIMEOUT_MS=5O``) fails the boot with a message naming the variable, rather than
the first limited hook hours later. Each helper takes the environment as an optional mapping so
tests can pass their own without touching ``os.environ``.

What this module does not do: cross-setting rules ("fleet scope needs Redis") are Django system
checks in ``ankusa_site.checks``, because they need the whole picture.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    return None if value is None else value.strip()


def env_str(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """A string; an unset variable gives ``default``, and no default means it is required."""
    value = _raw(name, environ)
    if value is None or value == "":
        if default is None:
            raise ImproperlyConfigured(f"{name} is required but not set.")
        return default
    return value


def env_bool(name: str, default: bool = False, *, environ: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, environ)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={value!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off."
    )


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    value = _raw(name, environ)
    if value is None or value == "":
        return default
    try:
        number = int(value.replace("_", ""))
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number.") from None
    _check_range(name, number, minimum, maximum)
    return number


def env_float(
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    value = _raw(name, environ)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number.") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={value!r} is not a finite number.")
    _check_range(name, number, minimum, maximum)
    return number


def _check_range(name: str, number: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum of {minimum}.")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum of {maximum}.")


def env_choice(
    name: str, default: str, choices: tuple[str, ...], *, environ: Mapping[str, str] | None = None
) -> str:
    value = _raw(name, environ)
    if value is None or value == "":
        return default
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} is not one of: {', '.join(choices)}.")
    return value


def env_list(name: str, default: list[str], *, environ: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated list; blank items are dropped."""
    value = _raw(name, environ)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_networks(
    name: str, default: list[str], *, environ: Mapping[str, str] | None = None
) -> tuple[IPv4Network | IPv6Network, ...]:
    """Comma-separated addresses or CIDRs (``10.1.0.0/16,::1/128``; a bare address is one host).
    No wildcard: a list that trusts everyone is written out, not implied by ``*``. Host bits set
    (``10.1.2.3/16``) are refused as a likely typo rather than widened silently."""
    networks = []
    for item in env_list(name, default, environ=environ):
        try:
            networks.append(ip_network(item))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {item!r} is not a network ({exc}).") from None
    return tuple(networks)


def env_mapping(
    name: str, choices: tuple[str, ...], *, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``key=value,key=value`` with every value one of ``choices`` (``commands=redis``)."""
    value = _raw(name, environ)
    result: dict[str, str] = {}
    if not value:
        return result
    for pair in value.split(","):
        if not pair.strip():
            continue
        key, sep, item = pair.partition("=")
        key, item = key.strip(), item.strip()
        if not sep or not key:
            raise ImproperlyConfigured(f"{name}: {pair.strip()!r} is not of the form name=value.")
        if item not in choices:
            raise ImproperlyConfigured(f"{name}: {key}={item!r} is not one of: {', '.join(choices)}.")
        result[key] = item
    return result


# SQLite waits this long for a competing writer before raising "database is locked". Twenty seconds
# covers a dispatch round committing a large batch while gunicorn threads take intake writes.
SQLITE_BUSY_TIMEOUT_S = 20
# Each thread keeps its SQLite connection across requests, as PostgreSQL's are kept
# (``conn_max_age``). Closed after each request instead, the last connection to the file (of any
# process) checkpoints the write-ahead log into it and deletes it as it closes: measured in one
# process serving webhooks, 0.8 ms of a 2.3 ms request, and the connect and its PRAGMAs came on top.
SQLITE_CONN_MAX_AGE_S = 60
# A kept connection never deletes the write-ahead log, which stays as large as the largest burst
# since the file was opened; past this size, SQLite truncates it back when it next starts over.
SQLITE_WAL_LIMIT_BYTES = 64 * 1024 * 1024


def shown_url(value: str) -> str:
    """A URL as an error message may show it: its password, if any, replaced by ``***``."""
    parts = urlsplit(value)
    if "@" not in parts.netloc:
        return value
    userinfo, host = parts.netloc.rsplit("@", 1)
    if ":" not in userinfo:
        return value
    return urlunsplit(parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{host}"))


def parse_database_url(name: str, value: str, *, base_dir: Path) -> dict:
    """Turn ``sqlite:///path`` or ``postgres://user:pass@host:port/db`` into a ``DATABASES`` entry.

    SQLite runs in WAL mode (readers never block the writer) with a busy timeout, and every
    transaction starts ``IMMEDIATE`` so two writers queue on the lock at ``BEGIN`` instead of one
    failing with "database is locked" when it upgrades a read lock halfway through; the site's
    backend (``ankusa_site.sqlite3``) waits for that lock in short steps.
    ``sqlite:///var/x.db`` is relative to the project folder, ``sqlite:////srv/x.db`` absolute.
    """
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        # dj-database-url's convention: sqlite:///var/x.db is relative, sqlite:////srv/x.db absolute.
        raw_path = unquote(value[len("sqlite://") :])
        raw_path = raw_path[1:] if raw_path.startswith("/") else raw_path
        if not raw_path or raw_path.endswith("/"):
            raise ImproperlyConfigured(f"{name}={shown_url(value)!r} names no SQLite file.")
        path = Path(raw_path)
        if not path.is_absolute():
            path = base_dir / path
        return {
            "ENGINE": "ankusa_site.sqlite3",
            "NAME": str(path),
            "OPTIONS": {
                "timeout": SQLITE_BUSY_TIMEOUT_S,
                "transaction_mode": "IMMEDIATE",
                "init_command": (
                    "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;"
                    f"PRAGMA journal_size_limit={SQLITE_WAL_LIMIT_BYTES}"
                ),
            },
            "CONN_MAX_AGE": SQLITE_CONN_MAX_AGE_S,
            # A file, not Django's default in-memory test database, so the subprocesses that the
            # concurrency tests start see the same data.
            "TEST": {"NAME": str(path.with_name(f"test_{path.name}"))},
        }
    if scheme in ("postgres", "postgresql", "pgsql"):
        database = unquote(parts.path.lstrip("/"))
        if not database:
            raise ImproperlyConfigured(f"{name}={shown_url(value)!r} names no database.")
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured(f"{name}={shown_url(value)!r} has an invalid port.") from None
        options = dict(parse_qsl(parts.query))
        conn_max_age = options.pop("conn_max_age", "60")
        try:
            max_age = int(conn_max_age)
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: conn_max_age={conn_max_age!r} is not a whole number."
            ) from None
        # Server-side prepared statements, for the hot statements that ask for them (see
        # ankusa_site.core.prepared; Django's own cursors never prepare). ``off`` for a connection pooler
        # in transaction mode that cannot keep them; those statements are then planned every time.
        threshold = options.pop("prepare_threshold", "5")
        if threshold.lower() == "off":
            options["prepare_threshold"] = None
        elif threshold.isdigit():
            options["prepare_threshold"] = int(threshold)
        else:
            raise ImproperlyConfigured(
                f"{name}: prepare_threshold={threshold!r} is neither a whole number nor off."
            )
        return {
            # Django's backend with a health check that needs no round trip (see its docstring).
            "ENGINE": "ankusa_site.postgresql",
            "NAME": database,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "CONN_MAX_AGE": max_age,
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": options,
        }
    raise ImproperlyConfigured(
        f"{name}={shown_url(value)!r}: only sqlite:// and postgres:// URLs are supported."
    )


def env_database(
    name: str, default: str, *, base_dir: Path, environ: Mapping[str, str] | None = None
) -> dict:
    return parse_database_url(name, env_str(name, default, environ=environ), base_dir=base_dir)


def env_redis_url(name: str, default: str, *, environ: Mapping[str, str] | None = None) -> str:
    value = env_str(name, default, environ=environ)
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"{name}={shown_url(value)!r}: use a redis://, rediss:// or unix:// URL.")
    if parts.scheme != "unix":
        try:
            parts.port  # noqa: B018 - urlsplit validates the port lazily
        except ValueError:
            raise ImproperlyConfigured(f"{name}={shown_url(value)!r} has an invalid port.") from None
        if not parts.hostname:
            raise ImproperlyConfigured(f"{name}={shown_url(value)!r} names no host.")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise ImproperlyConfigured(
                f"{name}={shown_url(value)!r}: the database number must be a whole number."
            )
    return value
