"""``manage.py demo`` gives the dispatch loop something to do, once, however often it runs, and prints
curl lines for the intake that work as pasted."""

from __future__ import annotations

import json
import shlex
import subprocess
from urllib.parse import urlsplit

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from commands.models import Command, Connector, Source
from commands.staff.views import demo_receiver
from commands.states import State
from limits.models import ApiToken


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


def run_demo(tmp_path) -> list[str]:
    out = tmp_path / "out"
    call_command("demo", stdout=open(out, "w"))
    return out.read_text().splitlines()


def parse_curl(line: str) -> tuple[str, dict[str, str], bytes]:
    """``(url, headers, body)`` of a printed ``curl -i -X POST url -H ... --data-binary body``."""
    words = shlex.split(line)
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    return words[4], headers, words[words.index("--data-binary") + 1].encode()


def send(client, line: str):
    url, headers, body = parse_curl(line)
    content_type = headers.pop("Content-Type")
    return client.post(urlsplit(url).path, body, content_type=content_type, headers=headers)


def test_the_printed_curl_lines_work_as_pasted(db, settings, tmp_path, client):
    settings.VAR_DIR = tmp_path
    lines = run_demo(tmp_path)
    webhook = lines[
        lines.index("Send a signed webhook (paste it twice: the second answer is a duplicate):") + 1
    ]
    submit = lines[lines.index("Submit a command with the demo tenant's API token:") + 1]
    assert webhook.startswith("  curl -i -X POST http://127.0.0.1:8000/hooks/demo/orders/ ")
    first, again = send(client, webhook), send(client, webhook)
    assert (first.status_code, json.loads(again.content)["status"]) == (202, "duplicate")
    assert send(client, submit).status_code == 202


def test_the_demo_token_and_webhook_secret_are_made_once_and_kept_private(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    for _ in range(2):
        run_demo(tmp_path)
    token, secret = (tmp_path / "demo-token"), (tmp_path / "demo-webhook-secret")
    assert ApiToken.objects.filter(tenant__slug="demo").count() == 1
    assert (token.stat().st_mode & 0o777, secret.stat().st_mode & 0o777) == (0o600, 0o600)
    source = Source.objects.get(slug="orders")
    assert (source.verifier, source.verifier_secrets, source.dedupe_key) == (
        "github",
        [secret.read_text()],
        "github",
    )
    # A token revoked since is replaced by a new one, not printed dead.
    ApiToken.objects.update(revoked_at=timezone.now())
    run_demo(tmp_path)
    assert ApiToken.objects.usable().filter(tenant__slug="demo").count() == 1


def test_run_again_on_another_port_the_demo_connector_follows_its_receiver(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    out = open(tmp_path / "out", "w")
    call_command("demo", stdout=out)
    call_command("demo", "--receiver-url", "http://127.0.0.1:8001/demo/receiver/", stdout=out)
    assert Connector.objects.get(name="http").url == "http://127.0.0.1:8001/demo/receiver/"
    Connector.objects.filter(name="http").update(url="https://orders.example/hook")  # a person's choice
    call_command("demo", "--receiver-url", "http://127.0.0.1:8002/demo/receiver/", stdout=out)
    assert Connector.objects.get(name="http").url == "https://orders.example/hook"


def test_make_run_serves_and_points_the_demo_at_the_port_it_is_given(settings):
    printed = subprocess.run(
        ["make", "-n", "run", "PORT=8123"], cwd=settings.BASE_DIR, capture_output=True, text=True, check=True
    ).stdout
    plan = " ".join(printed.replace("\\\n", " ").split())  # one line per command, as the shell reads it
    assert "demo --site-url http://127.0.0.1:8123 --receiver-url http://127.0.0.1:8123/demo/receiver/" in plan
    assert "serve --bind 127.0.0.1:8123" in plan


@pytest.mark.parametrize("url", ["javascript:alert(1)", "http://127.0.0.1:99999/demo/receiver/", "not a url"])
def test_the_demo_refuses_a_url_no_connector_could_post_to_and_makes_nothing(db, settings, tmp_path, url):
    settings.VAR_DIR = tmp_path
    with pytest.raises(CommandError, match="--receiver-url"):
        call_command("demo", "--receiver-url", url, stdout=open(tmp_path / "out", "w"))
    assert not Connector.objects.exists()
