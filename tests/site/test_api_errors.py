"""Paths no view answers, under /api/ and /hooks/, get the JSON error shape, not an HTML page."""

import pytest


@pytest.mark.parametrize("path", ["/api/v1/nothing-here/", "/hooks/../../etc/passwd", "/api/"])
def test_an_unknown_api_path_is_a_json_404(client, db, path):
    response = client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"] == "not_found"


def test_an_unknown_admin_path_keeps_the_html_404(client, db):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("method", ["get", "post", "patch", "delete"])
def test_an_api_path_without_its_trailing_slash_is_a_json_404_naming_the_right_one(client, db, method):
    body = {} if method == "get" else {"data": '{"connector": "x"}', "content_type": "application/json"}
    response = getattr(client, method)("/api/v1/commands", **body)
    assert response.status_code == 404
    assert response.json() == {
        "error": "not_found",
        "detail": "No endpoint at /api/v1/commands. Its paths end with a slash: /api/v1/commands/",
    }


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/api/v1/nothing/", "/api/nothing", "/hooks/"])
def test_a_path_under_the_api_that_names_nothing_is_a_json_404_in_debug_mode_too(
    client, db, settings, debug, path
):
    settings.DEBUG = debug
    response = client.post(path, "{}", content_type="application/json")
    assert (response.status_code, response.json()) == (
        404,
        {"error": "not_found", "detail": f"No endpoint at {path}."},
    )


def test_a_nested_field_error_says_its_message_and_where_in_detail(world, call):
    status, data = call("operator", "POST", "/api/v1/commands/resend/", {"ids": [world.a.command.pk, "a"]})
    assert (status, data["error"]) == (400, "invalid")
    assert data["detail"] == "ids[1]: A valid integer is required."
    assert data["fields"] == {"ids": {"1": ["A valid integer is required."]}}


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/api/v1/commands/", {"HTTP_CONTENT_ENCODING": "gzip"}),
        ("/api/v1/commands/", {"HTTP_CONTENT_ENCODING": "br"}),
        ("/hooks/acme/orders/", {"HTTP_CONTENT_ENCODING": "gzip"}),
        ("/api/v1/commands/", {"CONTENT_TYPE": "application/json; charset=utf-16"}),
        ("/hooks/acme/orders/", {"CONTENT_TYPE": 'application/json; charset="latin-1"'}),
    ],
)
def test_a_body_compressed_or_in_another_charset_is_a_415_before_it_is_read(client, db, path, headers):
    response = client.post(
        path, b'{"connector": "x", "payload": {}}', content_type="application/json", **headers
    )
    assert (response.status_code, response.json()["error"]) == (415, "unsupported_media_type")


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=UTF-8", 'application/json; charset="utf8"']
)
def test_a_body_that_says_utf_8_or_identity_is_read_as_any_other(client, db, content_type):
    response = client.post(
        "/api/v1/commands/", b"{}", content_type=content_type, HTTP_CONTENT_ENCODING="identity"
    )
    assert response.status_code == 401  # past the body's checks, to the token's
