import json

import pytest

from commands.intake.event_keys import EventKeyConfigError, extract, needs_json, normalise, resolve


@pytest.mark.parametrize(
    ("location", "headers", "expected"),
    [
        ("github", {"X-GitHub-Delivery": "72d3162e"}, "72d3162e"),
        ("standard", {"webhook-id": "msg_1"}, "msg_1"),
        ("svix", {"svix-id": "msg_2"}, "msg_2"),
        ("shopify", {"X-Shopify-Webhook-Id": "b54557e4"}, "b54557e4"),
        ("header:X-Request-Id", {"x-request-id": " r-9 "}, "r-9"),
    ],
)
def test_header_locations_read_the_key_case_insensitively(location, headers, expected):
    assert extract(location, headers, b"{}") == expected


def test_stripe_reads_the_json_id():
    assert extract("stripe", {}, b'{"id": "evt_1", "object": "event"}') == "evt_1"


def test_a_json_path_walks_objects_and_list_indices():
    body = json.dumps({"data": {"events": [{"id": 7}, {"id": 8}]}}).encode()
    assert extract("json:data.events.1.id", {}, body) == "8"


def test_an_already_parsed_body_is_not_parsed_again():
    assert extract("json:id", {}, b"not json at all", parsed={"id": "from-parsed"}) == "from-parsed"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"id": null}',
        b'{"id": true}',
        b'{"id": {"nested": 1}}',
        b'{"id": "  "}',
        b"\xff\xfe",
        b"[]",
    ],
)
def test_a_missing_or_unusable_json_key_is_none(body):
    assert extract("json:id", {}, body) is None


def test_a_missing_header_is_none():
    assert extract("github", {"X-Other": "1"}, b"") is None


def test_none_means_no_dedupe():
    assert resolve("none") is None
    assert extract("none", {"X-GitHub-Delivery": "1"}, b"") is None


def test_keys_up_to_200_bytes_are_kept_as_they_are():
    key = "k" * 200
    assert normalise(key) == key


def test_longer_keys_are_replaced_by_their_sha256():
    first, second = normalise("k" * 201), normalise("k" * 200 + "j")
    assert first.startswith("sha256:") and len(first) == 7 + 64
    assert first != second


def test_the_200_byte_limit_counts_utf8_bytes_not_characters():
    assert normalise("é" * 101).startswith("sha256:")


def test_needs_json_tells_whether_the_body_must_be_parsed():
    assert needs_json("stripe") is True
    assert needs_json("github") is False
    assert needs_json("none") is False


@pytest.mark.parametrize(
    "location",
    [
        "cookie:x",
        "header:",
        "header:Bad Name",
        "json:",
        "json:a..b",
        "github2",
        42,
        "json:" + ".".join("a" * 21),
    ],
)
def test_a_location_that_can_never_yield_a_key_is_refused(location):
    with pytest.raises(EventKeyConfigError):
        resolve(location)
