"""Hostile input in the command admin's filters, forms and actions: a normal admin answer — the
invalid-filter redirect, a form error on the field, a message — never a 500, never a stored value
the page then cannot show (``ankusa_site.core.admin``'s guards, shared by every admin)."""

from __future__ import annotations

import pytest
from django.contrib.admin import helpers
from django.contrib.messages import get_messages
from django.db import connection
from django.urls import reverse

from commands.models import AuditEntry, Command, Connector, Source
from commands.states import State
from tests.commands.staff import login_as, make_failed

FAILED_LIST = reverse("admin:commands_failedcommand_changelist")
COMMAND_LIST = reverse("admin:commands_command_changelist")
TOO_BIG = "99999999999999999999999"  # beyond 2**63 - 1

# Text typed into a JSON field, and the start of the error the field must show for it.
UNSTORABLE_JSON = {
    "null": "This field cannot be null",
    "NaN": "Enter a valid JSON. NaN is not a JSON number",
    '{"a": 1e999}': "The JSON holds a number too large to store.",
    "[" * 100_000: "The JSON is nested deeper than 64 levels.",
    "[" * 65 + "]" * 65: "The JSON is nested deeper than 64 levels.",
    "1" * 5000: "Enter a valid JSON. Exceeds the limit (4300 digits)",
    '{"a": "\\ud800"}': "The JSON holds a NUL character or a lone surrogate, which cannot be stored.",
    '{"a": "\\u0000"}': "The JSON holds a NUL character or a lone surrogate, which cannot be stored.",
    '{"\\u0000": 1}': "The JSON holds a NUL character or a lone surrogate, which cannot be stored.",
}
CASES = list(UNSTORABLE_JSON.items())
CASE_IDS = ["null", "nan", "1e999", "deep-100000", "deep-65", "5000-digits", "surrogate", "nul", "nul-key"]


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def field_errors(response, field: str) -> list[str]:
    assert response.status_code == 200
    form = response.context["adminform"].form if "adminform" in response.context else response.context["form"]
    return form.errors.get(field, [])


# --- 1. ?audit=<id> -----------------------------------------------------------------------------


@pytest.mark.parametrize("url", [COMMAND_LIST, FAILED_LIST])
@pytest.mark.parametrize("value", ["%C2%B2", "%D9%A3", TOO_BIG, "9223372036854775808", "-1", "1_0", "x"])
def test_an_audit_id_that_is_no_id_is_the_changelists_invalid_filter_redirect(staff, url, value):
    response = staff.get(f"{url}?audit={value}")
    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")


def test_the_largest_audit_id_filters_to_nothing(staff, make_connector):
    make_failed(make_connector(url="http://127.0.0.1:9/"))
    response = staff.get(f"{FAILED_LIST}?audit=9223372036854775807")
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_an_audit_id_still_lists_the_commands_of_its_entry(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    touched, _other = make_failed(connector), make_failed(connector)
    entry = AuditEntry.objects.create(action="cancel", via="admin", count=1, done=1)
    entry.commands.set([touched])
    response = staff.get(f"{FAILED_LIST}?audit={entry.pk}")
    assert [c.pk for c in response.context["cl"].result_list] == [touched.pk]


# --- 3. JSON fields -----------------------------------------------------------------------------


def connector_data(owner, **changes) -> dict:
    data = {"tenant": owner.pk, "name": "c", "kind": "log", "enabled": "on", "url": "", "method": "POST"}
    data.update({"headers": "{}", "status_map": "{}", "secret_header": "", "secret": ""})
    data.update(changes)
    return data


def command_data(owner, target, **changes) -> dict:
    data = {"tenant": owner.pk, "connector": target.pk, "payload": "{}", "idempotency_key": ""}
    data.update({"attempt_set-TOTAL_FORMS": "0", "attempt_set-INITIAL_FORMS": "0"})
    data.update(changes)
    return data


@pytest.mark.parametrize(("text", "error"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("field", ["headers", "status_map"])
def test_a_connector_json_field_a_database_cannot_store_is_a_field_error(staff, tenant, field, text, error):
    response = staff.post(reverse("admin:commands_connector_add"), connector_data(tenant, **{field: text}))
    errors = field_errors(response, field)
    assert len(errors) == 1 and errors[0].startswith(error)
    assert not Connector.objects.exists()


@pytest.mark.parametrize(("text", "error"), CASES, ids=CASE_IDS)
def test_a_source_verifier_options_a_database_cannot_store_is_a_field_error(staff, tenant, text, error):
    data = {"tenant": tenant.pk, "slug": "s", "verifier": "none", "verifier_options": text, "dedupe_key": ""}
    response = staff.post(reverse("admin:commands_source_add"), data)
    errors = field_errors(response, "verifier_options")
    assert len(errors) == 1 and errors[0].startswith(error)
    assert not Source.objects.exists()


@pytest.mark.parametrize(("text", "error"), CASES, ids=CASE_IDS)
def test_a_command_payload_a_database_cannot_store_is_a_field_error(
    staff, tenant, make_connector, text, error
):
    connector = make_connector(kind="log")
    response = staff.post(
        reverse("admin:commands_command_add"), command_data(tenant, connector, payload=text)
    )
    errors = field_errors(response, "payload")
    assert len(errors) == 1 and errors[0].startswith(error)
    assert not Command.objects.exists()


@pytest.mark.parametrize(("text", "error"), CASES, ids=CASE_IDS)
def test_a_new_command_payload_a_database_cannot_store_is_a_field_error(staff, make_connector, text, error):
    original = make_failed(make_connector(url="http://127.0.0.1:9/"), outlook="never", reason="never")
    url = reverse("admin:commands_failedcommand_new_command", args=[original.pk])
    response = staff.post(url, {"payload": text, "reason": ""})
    errors = field_errors(response, "payload")
    assert len(errors) == 1 and errors[0].startswith(error)
    assert not Command.objects.filter(resent_from=original).exists()
    original.refresh_from_db()
    assert original.state == State.FAILED


def test_a_refused_payload_is_shown_back_as_typed(staff, tenant, make_connector):
    connector = make_connector(kind="log")
    typed = '{"a": "\\ud800"}'
    response = staff.post(
        reverse("admin:commands_command_add"), command_data(tenant, connector, payload=typed)
    )
    assert "{&quot;a&quot;: &quot;\\ud800&quot;}" in response.content.decode()


def test_an_empty_json_field_is_refused_rather_than_stored_as_null(staff, tenant):
    response = staff.post(reverse("admin:commands_connector_add"), connector_data(tenant, headers=""))
    assert field_errors(response, "headers")[0].startswith("This field cannot be null")


def test_storable_json_with_escapes_and_a_long_number_is_saved_as_typed(staff, tenant, make_connector):
    connector = make_connector(kind="log")
    typed = '{"emoji": "\\ud83d\\ude00", "n": ' + "9" * 4000 + ', "x": 0.25}'
    response = staff.post(
        reverse("admin:commands_command_add"), command_data(tenant, connector, payload=typed)
    )
    assert response.status_code == 302
    command = Command.objects.get()
    assert command.payload == {"emoji": "\U0001f600", "n": int("9" * 4000), "x": 0.25}
    assert staff.get(reverse("admin:commands_command_change", args=[command.pk])).status_code == 200


def test_a_stored_lone_surrogate_is_shown_escaped_not_a_500(staff, tenant, make_connector):
    # Rows written before the form refused them: SQLite stores "\ud800" as it is told.
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL never stores a lone surrogate")
    connector = make_connector(kind="log", headers={"X-A": "b\ud800"})
    command = Command.objects.create(tenant=tenant, connector=connector, payload={"a": "\ud800"})
    for url in (
        reverse("admin:commands_command_change", args=[command.pk]),
        reverse("admin:commands_connector_change", args=[connector.pk]),
    ):
        response = staff.get(url)
        assert response.status_code == 200
        assert "\\ud800" in response.content.decode()


# --- 4. a foreign key that is no key ----------------------------------------------------------


NOT_A_CHOICE = "Select a valid choice. That choice is not one of the available choices."


@pytest.mark.parametrize(
    ("value", "error"),
    [("x", NOT_A_CHOICE), (TOO_BIG, NOT_A_CHOICE), ("²", NOT_A_CHOICE), ("1.5", NOT_A_CHOICE)]
    + [("\x00", "Null characters are not allowed.")],
)
@pytest.mark.parametrize("page", ["connector", "source", "command"])
def test_a_foreign_key_that_is_no_key_is_a_field_error(staff, tenant, make_connector, page, value, error):
    connector = make_connector(kind="log")
    data = {
        "connector": connector_data(tenant, tenant=value),
        "source": {
            "tenant": value,
            "slug": "s",
            "verifier": "none",
            "verifier_options": "{}",
            "dedupe_key": "",
        },
        "command": command_data(tenant, connector, tenant=value),
    }[page]
    response = staff.post(reverse(f"admin:commands_{page}_add"), data)
    assert field_errors(response, "tenant") == [error]


@pytest.mark.parametrize("value", ["x", TOO_BIG])
def test_a_raw_id_or_many_to_many_key_that_is_no_key_is_a_field_error(staff, tenant, make_connector, value):
    connector = make_connector(kind="log")
    response = staff.post(
        reverse("admin:commands_command_add"), command_data(tenant, connector, connector=value)
    )
    assert field_errors(response, "connector") == [NOT_A_CHOICE]
    data = {
        "tenant": tenant.pk,
        "slug": "s",
        "verifier": "none",
        "verifier_options": "{}",
        "connectors": [value],
    }
    response = staff.post(reverse("admin:commands_source_add"), data)
    assert field_errors(response, "connectors") == [f"“{value}” is not a valid value."]


# --- 5. a selection beyond 64 bits ----------------------------------------------------------------


@pytest.mark.parametrize("url", [FAILED_LIST, COMMAND_LIST])
@pytest.mark.parametrize("action", ["resend_selected", "cancel_selected", "new_command_selected"])
@pytest.mark.parametrize("confirmed", [False, True])
def test_a_selected_id_beyond_64_bits_is_refused_with_a_message(
    staff, make_connector, url, action, confirmed
):
    failed = make_failed(make_connector(url="http://127.0.0.1:9/", idempotent=True))
    data = {"action": action, helpers.ACTION_CHECKBOX_NAME: [str(failed.pk), TOO_BIG]}
    data.update({"confirmed": "yes"} if confirmed else {"index": "0"})
    response = staff.post(url, data)
    assert response.status_code == 302
    noun = "failed commands" if url == FAILED_LIST else "commands"
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"The selection holds '{TOO_BIG}': not an id of {noun}."
    ]
    failed.refresh_from_db()
    assert (failed.state, failed.resend_by) == (State.FAILED, None)
    assert not AuditEntry.objects.exists()
