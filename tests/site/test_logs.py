import json
import logging

import pytest

from ankusa_site.core.logs import JsonFormatter, TextFormatter, log_event


@pytest.fixture
def captured():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("ankusa.test-logs")
    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield logger, records
    logger.removeHandler(handler)


def test_json_lines_carry_the_event_and_its_fields(captured):
    logger, records = captured
    log_event(logger, "accepted", tenant="demo", command=12)
    data = json.loads(JsonFormatter().format(records[0]))
    assert {k: data[k] for k in ("level", "logger", "event", "tenant", "command")} == {
        "level": "info",
        "logger": "ankusa.test-logs",
        "event": "accepted",
        "tenant": "demo",
        "command": 12,
    }
    assert data["ts"].endswith("Z")


def test_text_lines_are_key_value_pairs_quoting_spaces(captured):
    logger, records = captured
    log_event(logger, "failed", outlook="after-fix", error="401 Unauthorized")
    line = TextFormatter().format(records[0])
    assert line.endswith('ankusa.test-logs failed outlook=after-fix error="401 Unauthorized"')


def test_text_values_that_could_be_misread_are_quoted(captured):
    logger, records = captured
    log_event(
        logger, "seen", empty="", equals="a=b", quote='say "hi"', newline="a\nb", plain="x-1.2", number=7
    )
    line = TextFormatter().format(records[0])
    assert line.endswith(
        'seen empty="" equals="a=b" quote="say \\"hi\\"" newline="a\\nb" plain=x-1.2 number=7'
    )


@pytest.mark.parametrize(
    "name",
    ["secret", "api_token", "password", "credentials", "Authorization", "signature", "body", "payload"],
)
def test_fields_named_like_secrets_or_bodies_are_redacted(captured, name):
    logger, records = captured
    log_event(logger, "configured", **{name: "hunter2"})
    assert "hunter2" not in JsonFormatter().format(records[0])
    assert "hunter2" not in TextFormatter().format(records[0])


def test_plain_messages_are_still_json(captured):
    logger, records = captured
    logger.warning("plain %s", "text")
    assert json.loads(JsonFormatter().format(records[0]))["message"] == "plain text"
