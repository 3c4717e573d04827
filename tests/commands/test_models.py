"""Models: conditional state moves, the sweep's due query, and a connector save waking after-fix commands."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from commands.models import Command, Source, is_credential_header
from commands.retry import Outlook, SkipReason
from commands.states import Event, State
from limits.models import Tenant


def test_transition_moves_only_from_the_expected_state(make_connector, make_command):
    command = make_command(make_connector())
    now = timezone.now()
    mine = Command.objects.filter(pk=command.pk)
    assert mine.transition(State.APPROVED, Event.DISPATCH, now) == 1
    assert mine.transition(State.APPROVED, Event.DISPATCH, now) == 0
    command.refresh_from_db()
    assert (command.state, command.state_changed_at) == (State.QUEUED, now)


def test_transition_keeps_the_querysets_conditions_and_writes_the_changes(make_connector, make_command):
    command = make_command(make_connector(), state=State.QUEUED, attempts=1)
    now = timezone.now()
    assert Command.objects.filter(pk=command.pk, attempts=0).transition(State.QUEUED, Event.START, now) == 0
    assert (
        Command.objects.filter(pk=command.pk, attempts=1).transition(
            State.QUEUED, Event.START, now, attempts=2
        )
        == 1
    )
    command.refresh_from_db()
    assert (command.state, command.attempts) == (State.DISPATCHING, 2)


def test_transition_refuses_a_move_the_table_does_not_have(make_connector, make_command):
    make_command(make_connector(), state=State.SUCCEEDED)
    with pytest.raises(ValueError, match="no transition from 'succeeded' on 'dispatch'"):
        Command.objects.transition(State.SUCCEEDED, Event.DISPATCH, timezone.now())


def test_due_is_approved_or_failed_not_parked_and_due_by_now(make_connector, make_command):
    connector, now = make_connector(), timezone.now()
    due = [
        make_command(connector),
        make_command(connector, state=State.FAILED, next_attempt_at=now),
        make_command(connector, state=State.FAILED, skip_reason=SkipReason.BACKING_OFF, next_attempt_at=now),
    ]
    for state in (State.DRAFT, State.QUEUED, State.DISPATCHING, State.SUCCEEDED, State.CANCELLED):
        make_command(connector, state=state)
    make_command(connector, state=State.FAILED, next_attempt_at=now + timedelta(seconds=1))
    for reason in (
        SkipReason.NEVER,
        SkipReason.ATTEMPTS_SPENT,
        SkipReason.OUTLOOK_UNKNOWN,
        SkipReason.NOT_IDEMPOTENT,
    ):
        make_command(connector, state=State.FAILED, skip_reason=reason)
    assert list(Command.objects.due(now).order_by("id")) == due


def test_saving_a_connector_decides_again_on_its_waiting_commands(make_connector, make_command):
    """An after-fix command of an idempotent connector is queued by the save; on one that is not
    idempotent, its retries wait as not-idempotent (the decision with the connector as it is now);
    another connector's commands are not touched."""
    connector, plain, other = (
        make_connector(idempotent=True),
        make_connector("plain"),
        make_connector("other"),
    )
    later = timezone.now() + timedelta(minutes=10)

    def failed(on, outlook, **fields):
        fields = {"attempts": 1, "next_attempt_at": later, "skip_reason": SkipReason.BACKING_OFF, **fields}
        return make_command(on, state=State.FAILED, last_outlook=outlook, **fields)

    waiting, again = failed(connector, Outlook.AFTER_FIX, attempts=2), failed(connector, Outlook.AGAIN)
    unfixable, elsewhere = failed(plain, Outlook.AFTER_FIX), failed(other, Outlook.AFTER_FIX, skip_reason="")
    connector.secret = "Bearer fixed"
    connector.save()
    plain.save()
    for command in (waiting, again, unfixable, elsewhere):
        command.refresh_from_db()
    assert (waiting.state, waiting.attempts, connector.reconsidered.going) == (State.QUEUED, 2, 1)
    assert (again.state, again.skip_reason, again.next_attempt_at) == (State.FAILED, "backing-off", later)
    assert (unfixable.skip_reason, plain.reconsidered.parked) == ("not-idempotent", {"not-idempotent": 1})
    assert (elsewhere.skip_reason, elsewhere.next_attempt_at) == ("", later)


def test_a_command_must_use_its_own_tenants_connector_and_source(make_connector, tenant):
    stranger = Tenant.objects.create(slug="other", name="Other")
    command = Command(tenant=stranger, connector=make_connector())
    with pytest.raises(ValidationError, match="another tenant"):
        command.clean()
    command = Command(
        tenant=tenant, connector=make_connector("x"), source=Source.objects.create(tenant=stranger, slug="s")
    )
    with pytest.raises(ValidationError, match="The source belongs to another tenant"):
        command.clean()


def test_a_source_starts_its_commands_as_drafts_only_when_they_need_approval(tenant):
    assert Source(tenant=tenant, slug="a", needs_approval=True).initial_state == State.DRAFT
    assert Source(tenant=tenant, slug="b").initial_state == State.APPROVED


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("headers", ["X"], "Headers must be a JSON object of strings"),
        ("headers", {"X": 1}, "Headers must be a JSON object of strings"),
        ("headers", {"X Bad": "1"}, "is not a valid HTTP header name"),
        ("headers", {"X-Note": "a\r\nInjected: 1"}, "must be on one line"),
        ("headers", {"X-Note": "a\x00b"}, "The value of X-Note must not hold control characters"),
        ("headers", {"X-Note": "\u20ac"}, "The value of X-Note may hold only Latin-1 characters"),
        ("headers", {"authorization": "Bearer x"}, "carries a credential: put it in the secret"),
        ("headers", {"X-Auth-Token": "hunter2"}, "X-Auth-Token carries a credential"),
        ("headers", {"DD-API-KEY": "k"}, "DD-API-KEY carries a credential"),
        ("headers", {"X-Hasura-Admin-Secret": "s"}, "carries a credential"),
        ("headers", {"Private-Token": "t"}, "carries a credential"),
        ("headers", {"Ocp-Apim-Subscription-Key": "k"}, "carries a credential"),
        ("headers", {"X-AuthToken": "t"}, "carries a credential"),
        ("headers", {"X-JWT": "t"}, "carries a credential"),
        ("headers", {"Cookie2": "c"}, "carries a credential"),
        ("secret_header", "Author ization", "is not a valid HTTP header name"),
        ("status_map", {"abc": "never"}, "is not an HTTP status code"),
        ("status_map", {"503": "soon"}, "is not an outlook"),
        ("url", "ftp://example.test/", "Enter a valid URL"),
        ("url", "http://user:s3cretpw@127.0.0.1:1/x", "must not carry credentials"),
        ("url", "http://user@127.0.0.1:1/x", "must not carry credentials"),
        ("secret", "Bearer x\r\nX-Evil: 1", "The secret must be on one line"),
        ("secret", "Bearer x\x7f", "The secret must not hold control characters"),
        ("secret", "\u20ac", "The secret may hold only Latin-1 characters"),
        ("read_timeout_s", 295.0, "must stay under the queue's visibility timeout"),
    ],
)
def test_connector_configuration_is_validated(make_connector, field, value, message):
    connector = make_connector()
    setattr(connector, field, value)
    with pytest.raises(ValidationError, match=message):
        connector.full_clean()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("secret", "Bearer topsecretvalue\r\nX-Evil: 1"),
        ("secret", "Bearer topsecretvalue\x00"),
        ("secret", "Bearer topsecretvalue\u20ac"),
        ("url", "http://user:topsecretvalue@127.0.0.1:1/x"),
    ],
)
def test_a_connector_refuses_an_unsendable_secret_or_a_url_with_credentials_by_field_without_quoting_it(
    make_connector, field, value
):
    connector = make_connector(secret_header="Authorization", secret="Bearer ok")
    setattr(connector, field, value)
    with pytest.raises(ValidationError) as refused:
        connector.full_clean()
    assert list(refused.value.message_dict) == [field]
    assert "topsecretvalue" not in str(refused.value.message_dict)


def test_a_secret_with_a_tab_or_latin_1_characters_is_a_valid_header_value(make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization")
    connector.secret = "Bearer\tcaf\u00e9-token"
    connector.headers = {"X-Team": "op\ts \u00e9quipe"}
    connector.full_clean()


def test_the_admin_refuses_an_unsendable_secret_and_a_url_with_credentials(admin_client, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", secret_header="Authorization", secret="Bearer ok")
    data = {
        "tenant": connector.tenant_id, "name": connector.name, "kind": "http", "enabled": "on",
        "url": "http://user:topsecretpw@127.0.0.1:9/", "method": "POST", "headers": "{}",
        "status_map": "{}", "secret_header": "Authorization", "secret": "Bearer topsecretvalue\r\nX-Evil: 1",
    }  # fmt: skip
    page = admin_client.post(reverse("admin:commands_connector_change", args=[connector.pk]), data)
    assert page.status_code == 200  # the form again, with its errors
    form = page.context["adminform"].form
    assert set(form.errors) == {"url", "secret"}
    assert "must not carry credentials" in form.errors["url"][0]
    assert form.errors["secret"] == ["The secret must be on one line (no CR or LF)."]
    assert "topsecretvalue" not in page.content.decode()
    connector.refresh_from_db()
    assert (connector.url, connector.secret) == ("http://127.0.0.1:9/", "Bearer ok")


@pytest.mark.parametrize(
    "name",
    ["X-Team", "X-Author", "Idempotency-Key", "X-Idempotency-Key", "X-Routing-Key", "X-Partition-Key",
     "X-Session-Id", "Signature-Version", "Accept", "X-Keyboard"],
)  # fmt: skip
def test_a_header_whose_name_does_not_say_credential_is_not_taken_for_one(name):
    assert not is_credential_header(name)
