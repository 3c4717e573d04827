"""Every admin changelist refuses a forged selection with a message, never a 500."""

from __future__ import annotations

import pytest
from django.contrib.admin import helpers
from django.contrib.messages import get_messages
from django.urls import reverse

from tests.staff import staff_user


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changelist", "action", "noun"),
    [
        ("admin:queues_queueitem_changelist", "drop_selected", "queue items"),
        ("admin:limits_apitoken_changelist", "revoke", "api tokens"),
        ("admin:commands_connector_changelist", "delete_selected", "connectors"),
        ("admin:commands_failedcommand_changelist", "resend_selected", "failed commands"),
    ],
)
def test_a_selection_that_is_not_an_id_is_refused_with_a_message(client, changelist, action, noun):
    client.force_login(staff_user("admin"))
    url = reverse(changelist)
    response = client.post(url, {"action": action, helpers.ACTION_CHECKBOX_NAME: ["1", "abc"], "index": "0"})
    assert response.status_code == 302
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert messages == [f"The selection holds 'abc': not an id of {noun}."]
