"""The command lists say what each reason means once, in a legend above the rows (each row's badge
carries it as a tooltip), and reload themselves unless a person is busy on them."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils.html import escape

from commands.staff.explain import SKIP_REASONS, explain
from tests.commands.staff import make_failed


@pytest.fixture
def staff(admin_client):
    return admin_client


@pytest.mark.parametrize("model", ["command", "failedcommand"])
def test_each_reason_is_explained_once_above_the_list(staff, make_connector, model):
    connector = make_connector(url="http://127.0.0.1:9/")
    commands = [make_failed(connector, outlook="after-fix", reason="backing-off") for _ in range(3)]
    html = staff.get(reverse(f"admin:commands_{model}_changelist")).content.decode()
    legend = html.split('id="ankusa-legend"')[1].split("</details>")[0]
    for explanation in SKIP_REASONS.values():
        assert legend.count(f"{explanation.meaning} — <strong>{explanation.todo}</strong>") == 1
    # Each row's badge carries its own line (the reason, the next event and when) as a tooltip; the
    # sentence itself is hidden in rows by the list's style.
    for command in commands:
        assert f'title="{escape(explain(command).line())}"' in html
    assert "#result_list .ankusa-why { display: none; }" in html


def test_the_failed_list_reloads_itself_every_minute(staff):
    html = staff.get(reverse("admin:commands_failedcommand_changelist")).content.decode()
    assert 'id="ankusa-refresh" data-seconds="60" checked' in html
    # Paused while rows are selected or a field is being typed in.
    assert "input.action-select:checked" in html
