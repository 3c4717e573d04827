"""A command's page: attempts across resends, its payload escaped, the connector to fix, its audit rows;
and the audit list, read-only, linking to the commands of an entry however many there are."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from commands.models import Attempt, AuditEntry, Command
from commands.states import State
from tests.commands.staff import login_as, make_failed


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def attempt(command, number, **fields):
    return Attempt.objects.create(
        command=command, number=number, started_at=timezone.now(), finished_at=timezone.now(), **fields
    )


@pytest.mark.parametrize("model", ["command", "failedcommand"])
def test_the_detail_shows_every_attempt_across_resends_each_copy_linked(staff, make_connector, model):
    connector = make_connector(url="http://127.0.0.1:9/")
    first = make_failed(connector, outlook="never", reason="never")
    attempt(first, 1, ok=False, outlook="never", status_code=400, error_class="HTTPStatus")
    second = make_failed(connector, outlook="again", reason="attempts-spent", resent_from=first)
    attempt(second, 1, ok=False, outlook="again", status_code=503, error_class="HTTPStatus")
    attempt(second, 2, ok=False, outlook="again", status_code=502, error_class="HTTPStatus")
    third = Command.objects.create(tenant=connector.tenant, connector=connector, resent_from=second)
    page = staff.get(reverse(f"admin:commands_{model}_change", args=[second.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    for copy in (first, third):
        assert f'href="{reverse("admin:commands_command_change", args=[copy.pk])}"' in html
    assert f"command {second.pk}</a> (this one)" in html
    assert f"copy of {first.pk}" in html and f"copy of {second.pk}" in html
    assert html.count(">#1</a></td>") == 2 and html.count(">#2</a></td>") == 1
    assert "<td>400</td>" in html and "<td>502</td>" in html


def test_the_payload_is_pretty_printed_and_escaped(staff, make_connector):
    command = make_failed(
        make_connector(url="http://127.0.0.1:9/"), payload={"note": "<script>alert(1)</script>"}
    )
    html = staff.get(reverse("admin:commands_failedcommand_change", args=[command.pk])).content.decode()
    assert (
        '<pre class="ankusa-payload">{\n  &quot;note&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;\n}</pre>'
        in html
    )
    assert "<script>alert(1)" not in html


def test_the_detail_links_the_connector_to_fix_and_says_how_old_the_command_is(staff, make_connector):
    connector = make_connector(url="", secret_header="Authorization")
    command = make_failed(connector, outlook="after-fix", reason="backing-off")
    html = staff.get(reverse("admin:commands_failedcommand_change", args=[command.pk])).content.decode()
    assert f'href="{reverse("admin:commands_connector_change", args=[connector.pk])}"' in html
    assert "no URL; missing credential for the Authorization header" in html
    assert "the receiver asks for a configuration fix" in html
    assert "1 of its failed commands wait for a configuration fix" in html
    assert "Edit it to release this command" in html
    assert "0\xa0minutes" in html


def test_the_detail_lists_the_audit_entries_touching_the_command(staff, make_connector):
    command = make_failed(make_connector(url="http://127.0.0.1:9/"))
    user = User.objects.get(username="root")
    entry = AuditEntry.objects.create(
        user=user, username="root", action="resend", via="admin", reason="fixed the URL", count=1, done=1
    )
    entry.commands.add(command)
    html = staff.get(reverse("admin:commands_failedcommand_change", args=[command.pk])).content.decode()
    assert f'href="{reverse("admin:commands_auditentry_change", args=[entry.pk])}"' in html
    assert "1 of 1 changed via admin — fixed the URL" in html


def test_an_operator_sees_a_link_to_make_a_new_command_and_a_viewer_does_not(client, make_connector):
    command = make_failed(make_connector(url="http://127.0.0.1:9/"), outlook="never", reason="never")
    url = reverse("admin:commands_failedcommand_change", args=[command.pk])
    link = reverse("admin:commands_failedcommand_new_command", args=[command.pk])
    login_as(client, "viewer")
    assert link not in client.get(url).content.decode()
    login_as(client, "operator")
    assert link in client.get(url).content.decode()


def test_the_audit_list_is_read_only_and_links_to_its_commands(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    commands = [make_failed(connector) for _ in range(60)]
    entry = AuditEntry.objects.create(
        username="root", action="cancel", via="api", count=62, done=60, result={"skipped": {"not failed": 2}}
    )
    entry.commands.add(*commands)
    listing = staff.get(reverse("admin:commands_auditentry_changelist"))
    assert listing.status_code == 200
    html = listing.content.decode()
    assert (
        f"?audit={entry.pk}" in html
        and "60 changed</a> of 62 asked" in html
        and "skipped: 2 not failed" in html
    )
    detail = staff.get(reverse("admin:commands_auditentry_change", args=[entry.pk])).content.decode()
    assert "and more: 60 in all" in detail
    assert detail.count('href="/admin/commands/command/') >= 50
    filtered = staff.get(reverse("admin:commands_command_changelist"), {"audit": entry.pk})
    assert {c.pk for c in filtered.context["cl"].result_list} == {c.pk for c in commands}
    add = staff.post(reverse("admin:commands_auditentry_add"), {})
    delete = staff.post(reverse("admin:commands_auditentry_delete", args=[entry.pk]), {"post": "yes"})
    assert (add.status_code, delete.status_code) == (403, 403)
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_a_viewer_reads_the_audit_list(client, db):
    login_as(client, "viewer")
    AuditEntry.objects.create(username="x", action="approve", via="admin", count=1, done=1)
    assert client.get(reverse("admin:commands_auditentry_changelist")).status_code == 200


def test_the_command_list_shows_why_it_waits_and_filters_like_the_failed_list(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    waiting = make_failed(connector, outlook="after-fix", reason="")
    Command.objects.create(tenant=connector.tenant, connector=connector, state=State.DRAFT)
    page = staff.get(reverse("admin:commands_command_changelist"), {"reason": "after-fix"})
    assert {c.pk for c in page.context["cl"].result_list} == {waiting.pk}
    assert "ankusa-tone-fix" in page.content.decode()


def test_the_new_command_link_is_offered_only_for_a_failed_command(staff, make_connector, make_command):
    command = make_command(make_connector(kind="log"))
    html = staff.get(reverse("admin:commands_command_change", args=[command.pk])).content.decode()
    assert reverse("admin:commands_command_new_command", args=[command.pk]) not in html


def test_the_audit_list_costs_the_same_queries_for_3_and_30_entries(staff, make_connector):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    command = make_failed(make_connector(url="http://127.0.0.1:9/"))
    user = User.objects.get(username="root")

    def fill(n):
        for _ in range(n):
            entry = AuditEntry.objects.create(
                user=user,
                username="root",
                action="resend",
                via="admin",
                count=2,
                done=1,
                result={"skipped": {}},
            )
            entry.commands.add(command)

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(reverse("admin:commands_auditentry_changelist")).status_code == 200
        return len(captured)

    fill(3)
    few = queries()
    fill(27)
    assert queries() == few
