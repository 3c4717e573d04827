"""/metrics: who may scrape it, and that it carries both counted and scrape-time figures."""

import pytest
from prometheus_client import REGISTRY

from ankusa_site.core.metrics import INTAKE_RESPONSES, labelled
from commands.models import Command

pytestmark = pytest.mark.django_db

REMOTE = "203.0.113.9"  # TEST-NET-3: never a real peer


def scrape(client, remote="127.0.0.1", **headers):
    return client.get("/metrics", REMOTE_ADDR=remote, **headers)


def test_loopback_may_scrape(client):
    response = scrape(client)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")


def test_ipv6_loopback_may_scrape(client):
    assert scrape(client, remote="::1").status_code == 200


def test_a_remote_scrape_without_the_token_is_403_json(client, settings):
    settings.ANKUSA_METRICS_TOKEN = "t0ken"
    response = scrape(client, remote=REMOTE)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


def test_a_remote_scrape_with_a_wrong_token_is_403(client, settings):
    settings.ANKUSA_METRICS_TOKEN = "t0ken"
    assert scrape(client, remote=REMOTE, HTTP_AUTHORIZATION="Bearer nope").status_code == 403


def test_a_remote_scrape_with_the_token_is_allowed(client, settings):
    settings.ANKUSA_METRICS_TOKEN = "t0ken"
    assert scrape(client, remote=REMOTE, HTTP_AUTHORIZATION="Bearer t0ken").status_code == 200


def test_without_a_configured_token_only_loopback_may_scrape(client, settings):
    settings.ANKUSA_METRICS_TOKEN = ""
    assert scrape(client, remote=REMOTE, HTTP_AUTHORIZATION="Bearer ").status_code == 403


def test_counters_appear_in_the_scrape(client):
    before = (
        REGISTRY.get_sample_value("ankusa_intake_responses_total", {"endpoint": "hooks", "status": "202"})
        or 0
    )
    INTAKE_RESPONSES.labels(endpoint="hooks", status="202").inc()
    body = scrape(client).content.decode()
    assert f'ankusa_intake_responses_total{{endpoint="hooks",status="202"}} {before + 1}' in body


def test_commands_by_state_are_read_at_scrape_time(client, demo_command):
    body = scrape(client).content.decode()
    assert 'ankusa_commands{state="approved"} 1.0' in body


def test_queue_lengths_are_read_at_scrape_time(client):
    from queues.backends import get_queue

    get_queue("metrics-test", backend="database").enqueue({"a": 1}, {"a": 2})
    body = scrape(client).content.decode()
    assert 'ankusa_queue_length{backend="database",kind="main",queue="metrics-test"} 2.0' in body
    assert 'ankusa_queue_up{backend="database",queue="metrics-test"} 1.0' in body


@pytest.fixture
def demo_command():
    from commands.models import Connector
    from limits.models import Tenant

    tenant = Tenant.objects.create(slug="m", name="M")
    connector = Connector.objects.create(tenant=tenant, name="log", kind="log")
    return Command.objects.create(tenant=tenant, connector=connector, payload={})


def test_a_kept_label_set_counts_into_the_same_series_as_labels():
    sample = {"endpoint": "test-kept", "status": "418"}
    before = REGISTRY.get_sample_value("ankusa_intake_responses_total", sample) or 0
    labelled(INTAKE_RESPONSES, "test-kept", "418").inc()
    INTAKE_RESPONSES.labels(endpoint="test-kept", status="418").inc()
    assert labelled(INTAKE_RESPONSES, "test-kept", "418") is INTAKE_RESPONSES.labels("test-kept", "418")
    assert REGISTRY.get_sample_value("ankusa_intake_responses_total", sample) == before + 2
