from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from ankusa_site.core.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_mapping,
    env_redis_url,
    env_str,
    parse_database_url,
)

BASE = Path("/srv/ankusa")


def test_env_int_reads_a_whole_number_and_allows_underscores():
    assert env_int("N", 1, environ={"N": "72_000"}) == 72_000


def test_env_int_unset_gives_the_default():
    assert env_int("N", 7, environ={}) == 7


def test_env_int_rejects_a_typo_naming_the_variable():
    with pytest.raises(ImproperlyConfigured, match=r"ANKUSA_STORE_TIMEOUT_MS='5O' is not a whole number"):
        env_int("ANKUSA_STORE_TIMEOUT_MS", 50, environ={"ANKUSA_STORE_TIMEOUT_MS": "5O"})


def test_env_int_rejects_a_value_below_the_minimum():
    with pytest.raises(ImproperlyConfigured, match=r"ANKUSA_STORE_TIMEOUT_MS=0 is below the minimum of 1"):
        env_int("ANKUSA_STORE_TIMEOUT_MS", 50, minimum=1, environ={"ANKUSA_STORE_TIMEOUT_MS": "0"})


def test_env_int_rejects_a_value_above_the_maximum():
    with pytest.raises(ImproperlyConfigured, match=r"N=11 is above the maximum of 10"):
        env_int("N", 1, maximum=10, environ={"N": "11"})


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "ten"])
def test_env_float_rejects_non_finite_or_non_numbers(value):
    with pytest.raises(ImproperlyConfigured, match=r"^RATE="):
        env_float("RATE", 1.0, environ={"RATE": value})


def test_env_float_reads_a_fraction():
    assert env_float("RATE", 1.0, environ={"RATE": "0.5"}) == 0.5


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("YES", True), ("off", False), ("0", False)])
def test_env_bool_reads_the_usual_spellings(value, expected):
    assert env_bool("DEBUG", not expected, environ={"DEBUG": value}) is expected


def test_env_bool_rejects_anything_else():
    with pytest.raises(ImproperlyConfigured, match=r"DEBUG='maybe' is not a boolean"):
        env_bool("DEBUG", environ={"DEBUG": "maybe"})


def test_env_str_without_default_is_required():
    with pytest.raises(ImproperlyConfigured, match=r"SECRET_KEY is required but not set"):
        env_str("SECRET_KEY", environ={})


def test_env_choice_rejects_an_unknown_value_listing_the_choices():
    with pytest.raises(
        ImproperlyConfigured, match=r"ANKUSA_STORE_SCOPE='cluster' is not one of: node, fleet"
    ):
        env_choice("ANKUSA_STORE_SCOPE", "node", ("node", "fleet"), environ={"ANKUSA_STORE_SCOPE": "cluster"})


def test_env_list_splits_and_drops_blanks():
    assert env_list("ALLOWED_HOSTS", [], environ={"ALLOWED_HOSTS": "a.example, ,b.example,"}) == [
        "a.example",
        "b.example",
    ]


def test_env_mapping_reads_pairs():
    env = {"ANKUSA_QUEUE_BACKENDS": "commands=redis, audit=database"}
    assert env_mapping("ANKUSA_QUEUE_BACKENDS", ("database", "redis"), environ=env) == {
        "commands": "redis",
        "audit": "database",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [("commands", "is not of the form name=value"), ("commands=kafka", "commands='kafka' is not one of")],
)
def test_env_mapping_rejects_bad_pairs_naming_the_variable(value, message):
    with pytest.raises(ImproperlyConfigured, match=rf"ANKUSA_QUEUE_BACKENDS: .*{message}"):
        env_mapping("ANKUSA_QUEUE_BACKENDS", ("database", "redis"), environ={"ANKUSA_QUEUE_BACKENDS": value})


def test_sqlite_url_is_relative_to_the_project_with_three_slashes():
    db = parse_database_url("DATABASE_URL", "sqlite:///var/x.sqlite3", base_dir=BASE)
    assert db["NAME"] == "/srv/ankusa/var/x.sqlite3"
    assert db["TEST"]["NAME"] == "/srv/ankusa/var/test_x.sqlite3"


def test_sqlite_url_is_absolute_with_four_slashes():
    db = parse_database_url("DATABASE_URL", "sqlite:////data/x.sqlite3", base_dir=BASE)
    assert db["NAME"] == "/data/x.sqlite3"


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout_and_immediate_transactions():
    options = parse_database_url("DATABASE_URL", "sqlite:///x.db", base_dir=BASE)["OPTIONS"]
    assert "PRAGMA journal_mode=WAL" in options["init_command"]
    assert options["timeout"] == 20
    assert options["transaction_mode"] == "IMMEDIATE"


def test_sqlite_connections_are_kept_across_requests_as_postgresqls_are():
    sqlite = parse_database_url("DATABASE_URL", "sqlite:///x.db", base_dir=BASE)
    postgres = parse_database_url("DATABASE_URL", "postgres://db.internal/ankusa", base_dir=BASE)
    assert sqlite["CONN_MAX_AGE"] == postgres["CONN_MAX_AGE"] == 60


def test_postgres_url_is_split_into_its_parts():
    db = parse_database_url("DATABASE_URL", "postgres://ank:p%40ss@db.internal:6543/ankusa", base_dir=BASE)
    assert (db["ENGINE"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "ankusa_site.postgresql",
        "ank",
        "p@ss",
        "db.internal",
        "6543",
        "ankusa",
    )


@pytest.mark.parametrize(
    ("parse", "value"),
    [
        (lambda v: parse_database_url("DATABASE_URL", v, base_dir=BASE), "postgres://ank:s3cret@db:port/x"),
        (lambda v: env_redis_url("REDIS_URL", "", environ={"REDIS_URL": v}), "redis://:s3cret@cache:port/0"),
    ],
)
def test_a_bad_url_is_refused_without_showing_its_password(parse, value):
    with pytest.raises(ImproperlyConfigured, match="has an invalid port") as refused:
        parse(value)
    assert "s3cret" not in str(refused.value)
    assert ":***@" in str(refused.value)


def test_postgres_prepares_hot_statements_unless_told_off_for_a_pooler():
    options = lambda query: parse_database_url(  # noqa: E731
        "DATABASE_URL", f"postgres://db.internal/ankusa{query}", base_dir=BASE
    )["OPTIONS"]
    assert options("")["prepare_threshold"] == 5
    assert options("?prepare_threshold=20")["prepare_threshold"] == 20
    assert options("?prepare_threshold=off")["prepare_threshold"] is None
    with pytest.raises(ImproperlyConfigured, match=r"^DATABASE_URL: prepare_threshold='soon' is neither"):
        options("?prepare_threshold=soon")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mysql://root@localhost/x", "only sqlite:// and postgres:// URLs are supported"),
        ("postgres://localhost", "names no database"),
        ("postgres://localhost:port/x", "has an invalid port"),
        ("sqlite://", "names no SQLite file"),
    ],
)
def test_database_url_rejects_bad_values_naming_the_variable(value, message):
    with pytest.raises(ImproperlyConfigured, match=rf"^DATABASE_URL=.*{message}"):
        parse_database_url("DATABASE_URL", value, base_dir=BASE)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://localhost:6379", "use a redis://"),
        ("redis://localhost:xx/0", "has an invalid port"),
        ("redis://localhost:6379/zero", "database number must be a whole number"),
    ],
)
def test_redis_url_rejects_bad_values_naming_the_variable(value, message):
    with pytest.raises(ImproperlyConfigured, match=rf"^REDIS_URL=.*{message}"):
        env_redis_url("REDIS_URL", "redis://127.0.0.1:6379/0", environ={"REDIS_URL": value})
