"""The command lists say what each reason means once, in a legend above the rows (each row's badge
carries it as a tooltip), and reload themselves unless a person is busy on them."""

from __future__ import annotations

import pytest
from django.urls import reverse

from commands.explain import SKIP_REASONS
from tests.commands.staff import make_failed


@pytest.fixture
def staff(admin_client):
    return admin_client


@pytest.mark.parametrize("model", ["command", "failedcommand"])
def test_each_reason_is_explained_once_above_the_list(staff, make_connector, model):
    connector = make_connector(url="http://127.0.0.1:9/")
    for _ in range(3):
        make_failed(connector, outlook="after-fix", reason="backing-off")
    html = staff.get(reverse(f"admin:commands_{model}_changelist")).content.decode()
    legend = html.split('id="ankusa-legend"')[1].split("</details>")[0]
    for explanation in SKIP_REASONS.values():
        assert legend.count(f"{explanation.meaning} — <strong>{explanation.todo}</strong>") == 1
    after_fix = SKIP_REASONS["after-fix"]
    # Three rows, three tooltips; the sentence itself is hidden in rows by the list's style.
    assert html.count(f'title="{after_fix.line()}"') == 3
    assert "#result_list .ankusa-why { display: none; }" in html


def test_the_failed_list_reloads_itself_every_minute(staff):
    html = staff.get(reverse("admin:commands_failedcommand_changelist")).content.decode()
    assert 'id="ankusa-refresh" data-seconds="60" checked' in html
    # Paused while rows are selected or a field is being typed in.
    assert "input.action-select:checked" in html
