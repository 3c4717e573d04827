"""A connector's headers may not set framing, hop-by-hop or dispatch's own headers: refused when saved
(every door), and left out of a send for rows saved before the rule."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from commands.dispatch import adapters
from commands.models import Connector


def headers_error(headers: dict, **fields) -> list[str]:
    connector = Connector(
        tenant_id=1, name="x", kind="http", url="https://93.184.215.14/", headers=headers, **fields
    )
    with pytest.raises(ValidationError) as raised:
        connector.full_clean(exclude=["tenant"])
    return raised.value.message_dict["headers"]


@pytest.mark.parametrize(
    "name",
    ["Host", "content-length", "Transfer-Encoding", "CONNECTION", "Keep-Alive", "TE", "Trailer", "Upgrade",
     "Proxy-Connection", "proxy-x-anything"],
)  # fmt: skip
def test_framing_and_hop_by_hop_headers_are_refused_in_any_case(name):
    assert headers_error({name: "0"}) == [
        f"{name} is a framing or hop-by-hop header, which the connection sets itself: a connector may not set it."
    ]


@pytest.mark.parametrize("name", ["Content-Type", "idempotency-key"])
def test_headers_every_send_sets_itself_are_refused(name):
    assert headers_error({name: "x"}) == [f"{name} is set by every send itself: a connector may not set it."]


def test_the_header_carrying_the_secret_is_not_also_one_of_the_headers():
    assert headers_error({"x-signature": "a"}, secret_header="X-Signature", secret="s") == [
        "X-Signature carries the secret: it is not one of the headers."
    ]


def test_the_secret_may_not_go_in_a_framing_header():
    connector = Connector(tenant_id=1, name="x", kind="http", url="https://93.184.215.14/",
                          secret_header="Content-Length", secret="0")  # fmt: skip
    with pytest.raises(ValidationError) as raised:
        connector.full_clean(exclude=["tenant"])
    assert raised.value.message_dict["secret_header"] == [
        "Content-Length is a framing or hop-by-hop header, which the connection sets itself."
    ]


def test_the_api_refuses_a_framing_header(world, call):
    status, data = call(
        "operator",
        "PATCH",
        f"/api/v1/connectors/{world.a.connector.pk}/",
        {"headers": {"Content-Length": "0"}},
    )
    assert (status, data["fields"]["headers"]) == (
        400,
        ["Content-Length is a framing or hop-by-hop header, which the connection sets itself: "
         "a connector may not set it."],
    )  # fmt: skip


def test_a_send_leaves_out_the_reserved_headers_of_a_row_saved_before_the_rule(
    make_connector, make_command, sink
):
    connector = make_connector(
        url=sink.url,
        headers={"Content-Length": "0", "transfer-encoding": "chunked", "Host": "evil.example", "X-Team": "ops",
                 "content-type": "text/plain", "IDEMPOTENCY-KEY": "mine", "Connection": "close",
                 "x-sig": "stale"},
        secret_header="X-Sig",
        secret="fresh",
    )  # fmt: skip
    command = make_command(connector, {"order": "A-1"})
    outcome = adapters.send(command)
    assert (outcome.ok, outcome.status) == (True, 200)
    [received] = sink.received
    assert received.json == {"order": "A-1"}
    assert received.key == str(command.pk)
    headers = {name.lower(): value for name, value in received.headers.items()}
    assert (headers["host"], headers["content-type"], headers["content-length"]) == (
        f"127.0.0.1:{sink.port}",
        "application/json",
        str(len(received.body)),
    )
    assert (headers["x-team"], headers["x-sig"], "transfer-encoding" in headers) == ("ops", "fresh", False)
