"""Every admin changelist answers a query string it cannot use as Django answers a bad lookup — the
redirect to ``?e=1`` — never with a 500, on SQLite and PostgreSQL alike (``ankusa_site.core.admin``)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.db import connection, models
from django.urls import reverse

from ankusa_site.core.admin import AdminGuards
from tests.staff import staff_user

PROJECT_APPS = {"commands", "limits", "queues"}
TOO_BIG = "99999999999999999999999"  # beyond 2**63 - 1: an OverflowError in SQLite's driver


def changelist(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def registered(apps=None) -> list:
    return sorted(
        (model for model in admin.site._registry if apps is None or model._meta.app_label in apps),
        key=lambda model: model._meta.label,
    )


def date_fields() -> list[tuple]:
    """(model, its first date or date-time field) for every registered model that has one."""
    found = []
    for model in registered():
        dates = [
            f.name for f in model._meta.fields if isinstance(f, (models.DateField, models.DateTimeField))
        ]
        if dates:
            found.append((model, dates[0]))
    return found


@pytest.fixture
def staff(client, db):
    client.force_login(staff_user("admin"))
    return client


@pytest.fixture
def root(admin_client):
    return admin_client


def test_every_model_admin_of_the_site_uses_the_shared_guards():
    unguarded = [
        model._meta.label
        for model in registered()
        if not isinstance(admin.site._registry[model], AdminGuards)
    ]
    assert unguarded == []
    assert {model._meta.app_label for model in registered()} >= PROJECT_APPS


@pytest.mark.parametrize(("model", "field"), date_fields(), ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize(
    "lookup",
    ["__year=99999", "__year=0", "__year=-1", "__year=10000", "__iso_year=99999", "__year__gt=99999"],
)
def test_a_year_no_date_can_hold_is_the_changelists_invalid_filter_redirect(root, model, field, lookup):
    url = changelist(model)
    response = root.get(f"{url}?{field}{lookup}")
    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")


@pytest.mark.parametrize(
    "query",
    ["at__year=9999&at__month=12&at__day=31", "at__year=9999&at__month=12", "at__year=9999", "at__year=0"],
)
def test_a_date_hierarchy_step_past_year_9999_is_the_invalid_filter_redirect(root, query):
    url = reverse("admin:commands_auditentry_changelist")
    response = root.get(f"{url}?{query}")
    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")


def test_the_date_hierarchy_still_narrows_to_a_day(root):
    url = reverse("admin:commands_auditentry_changelist")
    assert root.get(f"{url}?at__year=2024&at__month=2&at__day=29").status_code == 200


@pytest.mark.parametrize("model", registered(), ids=lambda model: model._meta.label)
def test_a_key_beyond_64_bits_never_gives_a_500(root, model):
    url = changelist(model)
    response = root.get(f"{url}?pk__in={TOO_BIG}")
    if connection.vendor == "sqlite":  # its driver cannot bind the number
        assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")
    else:  # PostgreSQL compares it as a numeric: nothing matches
        assert response.status_code == 200
        assert list(response.context["cl"].result_list) == []


@pytest.mark.parametrize(
    ("name", "query"),
    [
        ("admin:commands_failedcommand_changelist", "last_error_class=%00"),
        ("admin:commands_failedcommand_changelist", "state__exact=%00"),
        ("admin:commands_command_changelist", "state__exact=%00"),
        ("admin:queues_queueitem_changelist", "state__exact=%00"),
        ("admin:commands_connector_changelist", "name=%00"),
        ("admin:limits_tenant_changelist", "name=%00"),
        ("admin:limits_apitoken_changelist", "name=%00"),
        ("admin:commands_connector_changelist", "q=a%00b"),
        ("admin:commands_failedcommand_changelist", "q=%00"),
    ],
)
def test_a_nul_in_a_filter_or_search_is_the_invalid_filter_redirect(staff, name, query):
    url = reverse(name)
    response = staff.get(f"{url}?{query}")
    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")


def test_an_action_posted_to_a_changelist_with_an_unusable_filter_changes_nothing(staff):
    url = reverse("admin:limits_apitoken_changelist")
    response = staff.post(
        f"{url}?created_at__year=99999", {"action": "revoke", "_selected_action": ["1"], "index": "0"}
    )
    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")


@pytest.mark.parametrize("term", ["%00", "a%00"])
def test_an_autocomplete_search_with_a_nul_finds_nothing(staff, term):
    url = reverse("admin:autocomplete")
    response = staff.get(f"{url}?app_label=commands&model_name=connector&field_name=tenant&term={term}")
    assert (response.status_code, response.json()["results"]) == (200, [])


@pytest.mark.parametrize(
    ("name", "query"),
    [
        ("admin:commands_connector_changelist", "secret__regex=%5EB"),
        ("admin:commands_connector_changelist", "secret__startswith=B"),
        ("admin:commands_connector_changelist", "secret=x"),
        ("admin:commands_source_changelist", "verifier_secrets__icontains=NVDP"),
        ("admin:commands_command_changelist", "connector__secret__startswith=B"),
        ("admin:auth_user_changelist", "password__startswith=pbkdf2"),
        ("admin:commands_delivery_changelist", "body__contains=card"),
    ],
)
def test_a_filter_on_a_secret_field_is_refused_whatever_its_lookup(root, name, query):
    assert root.get(f"{reverse(name)}?{query}").status_code == 400


@pytest.mark.parametrize(
    ("name", "query"),
    [
        ("admin:commands_command_changelist", "id__range=abc"),
        ("admin:commands_command_changelist", f"attempts__range={TOO_BIG}"),
        ("admin:commands_attempt_changelist", "id__regex=("),
        ("admin:commands_connector_changelist", "name__iregex=("),
        ("admin:commands_delivery_changelist", "headers__contains=abc"),
        ("admin:commands_delivery_changelist", "headers__x__exact=abc"),
        ("admin:commands_command_changelist", "created_at__year__range=1"),
        ("admin:commands_command_changelist", "state__exact__exact=x"),
    ],
)
def test_a_lookup_no_admin_filter_uses_is_refused_before_the_database_sees_it(root, name, query):
    assert root.get(f"{reverse(name)}?{query}").status_code == 400


@pytest.mark.parametrize(
    ("name", "query"),
    [
        ("admin:commands_command_changelist", "state__exact=failed"),
        ("admin:commands_command_changelist", "state__in=failed,queued"),
        ("admin:commands_command_changelist", "connector__id__exact=1"),
        ("admin:commands_command_changelist", "pk__in=1,2"),
        ("admin:commands_command_changelist", "created_at__gte=2024-01-01T00:00:00%2B00:00"),
        ("admin:commands_command_changelist", "created_at__year=2024&created_at__month=2"),
        ("admin:commands_command_changelist", "source__isnull=True"),
        ("admin:commands_delivery_changelist", "headers__isnull=False"),
        ("admin:commands_auditentry_changelist", "user__id__exact=1"),
        ("admin:limits_apitoken_changelist", "revoked_at__isempty=1"),
        ("admin:limits_apitoken_changelist", "revoked_at__isempty=0"),
    ],
)
def test_the_filters_the_admins_own_pages_use_still_narrow_the_list(root, name, query):
    assert root.get(f"{reverse(name)}?{query}").status_code == 200


@pytest.mark.parametrize("model", registered(), ids=lambda model: model._meta.label)
def test_every_link_of_a_changelists_own_filters_is_a_filter_its_url_may_ask_for(root, model):
    url = changelist(model)
    response = root.get(url)
    assert response.status_code == 200
    changes = response.context["cl"]
    links = [choice["query_string"] for spec in changes.filter_specs for choice in spec.choices(changes)]
    refused = [query for query in links if root.get(f"{url}{query}").status_code == 400]
    assert refused == []
