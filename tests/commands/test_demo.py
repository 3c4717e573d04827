"""``manage.py demo`` gives the dispatch loop something to do, once, however often it runs."""

from __future__ import annotations

import json

from django.core.management import call_command

from commands.models import Command, Connector, Source
from commands.states import State
from commands.views import demo_receiver


def test_demo_creates_two_connectors_a_source_and_three_commands_once(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    for _ in range(2):
        call_command("demo", stdout=open(tmp_path / "out", "w"))
    assert sorted(Connector.objects.values_list("name", "kind", "idempotent")) == [
        ("http", "http", True),
        ("log", "log", False),
    ]
    source = Source.objects.get()
    assert (source.slug, sorted(c.name for c in source.connectors.all())) == ("orders", ["http", "log"])
    assert Command.objects.count() == 3
    assert set(Command.objects.values_list("state", flat=True)) == {State.APPROVED}
    assert "Demo tenant: demo, source orders -> log, http" in (tmp_path / "out").read_text()


def test_the_demo_receiver_answers_what_the_payload_asks(rf):
    def post(body: str, **headers):
        return demo_receiver(rf.post("/demo/receiver/", body, content_type="application/json", **headers))

    ok = post('{"order": 1}', HTTP_IDEMPOTENCY_KEY="7")
    assert (ok.status_code, json.loads(ok.content)) == (200, {"received": "7", "status": 200})
    assert post('{"respond": 503}').status_code == 503
    assert post('{"respond": 99}').status_code == 200
    bad = post("not json")
    assert (bad.status_code, json.loads(bad.content)["error"]) == (400, "bad_json")


def test_the_demo_receiver_is_mounted_only_with_debug(client):
    # The test settings run with DEBUG off, as production does.
    assert client.post("/demo/receiver/", "{}", content_type="application/json").status_code == 404
