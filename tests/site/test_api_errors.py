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


@pytest.mark.parametrize("method", ["post", "patch", "delete"])
def test_an_api_write_without_its_trailing_slash_is_a_json_404_naming_the_right_path(client, db, method):
    body = {"data": '{"connector": "x"}', "content_type": "application/json"}
    response = getattr(client, method)("/api/v1/commands", **body)
    assert response.status_code == 404
    assert response.json() == {
        "error": "not_found",
        "detail": "No endpoint at /api/v1/commands. Its paths end with a slash: /api/v1/commands/",
    }


@pytest.mark.parametrize("path", ["/api/v1/commands?state=failed", "/api/docs", "/api/schema"])
def test_a_read_without_its_trailing_slash_is_redirected_to_it(client, db, path):
    response = client.get(path)
    path, _, query = path.partition("?")
    assert (response.status_code, response["Location"]) == (301, f"{path}/" + (f"?{query}" if query else ""))


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


BODY_HEADERS = {
    "gzip": {"HTTP_CONTENT_ENCODING": "gzip"},
    "br": {"HTTP_CONTENT_ENCODING": "br"},
    "utf-16": {"content_type": "application/json; charset=utf-16"},
    "latin-1": {"content_type": 'application/json; charset="latin-1"'},
}


def sent(world, caller: str, method: str, path: str, body: bytes, headers: dict):
    client = world.client(caller)
    return getattr(client, method)(path, body, **{"content_type": "application/json", **headers})


@pytest.mark.parametrize("headers", BODY_HEADERS.values(), ids=BODY_HEADERS)
def test_a_body_compressed_or_in_another_charset_is_a_415_wherever_a_body_is_read(world, headers):
    hook = sent(world, "anonymous", "post", "/hooks/acme/orders/", b"{}", headers)
    submit = sent(world, "tenant_a", "post", "/api/v1/commands/", b'{"connector": "billing"}', headers)
    patch = sent(world, "admin", "patch", f"/api/v1/connectors/{world.a.connector.pk}/", b"{}", headers)
    for response in (hook, submit, patch):
        assert (response.status_code, response.json()["error"]) == (415, "unsupported_media_type")


@pytest.mark.parametrize("charset", ["UTF-8", '"utf8"', "us-ascii"])
def test_a_body_that_says_utf_8_or_ascii_or_identity_is_read_as_any_other(world, charset):
    headers = {"content_type": f"application/json; charset={charset}", "HTTP_CONTENT_ENCODING": "identity"}
    path = f"/api/v1/connectors/{world.a.connector.pk}/"
    response = sent(world, "admin", "patch", path, b'{"enabled": false}', headers)
    assert (response.status_code, response.json()["enabled"]) == (200, False)
