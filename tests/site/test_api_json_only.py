"""The API answers JSON only, whatever the client accepts; its docs pages answer GET and HEAD, and
any other method with the JSON 405. The renderer cannot fail on text UTF-8 cannot encode."""

from __future__ import annotations

import json

import pytest


def test_the_renderer_escapes_text_utf8_cannot_encode():
    from ankusa_site.core.renderers import JSONRenderer

    data = {"\ud800": ["lone \udfff", "é ✓", "\U0001f680"]}
    rendered = JSONRenderer().render(data)
    assert json.loads(rendered) == data


def test_the_renderer_keeps_unicode_unescaped_when_it_can():
    from ankusa_site.core.renderers import JSONRenderer

    assert JSONRenderer().render({"name": "é ✓"}) == '{"name":"é ✓"}'.encode()


@pytest.mark.parametrize(
    ("path", "accept"),
    [
        ("/api/v1/commands/99999/", "text/html"),
        ("/api/v1/commands/", "text/html"),
        ("/api/v1/commands/99999/?format=api", "*/*"),
        ("/api/v1/commands/?format=api", "text/html"),
        ("/api/v1/tenants/?format=api", "*/*"),
    ],
)
def test_an_api_answer_is_never_html_whatever_the_client_asks(world, path, accept):
    response = world.client("admin").get(path, HTTP_ACCEPT=accept)
    assert response["Content-Type"] == "application/json"
    assert 400 <= response.status_code < 500
    assert set(response.json()) == {"error", "detail"}


def test_text_html_alone_is_not_acceptable(world):
    response = world.client("admin").get("/api/v1/commands/99999/", HTTP_ACCEPT="text/html")
    assert (response.status_code, response.json()["error"]) == (406, "not_acceptable")


def test_format_api_names_no_format_the_api_has(world):
    response = world.client("admin").get("/api/v1/commands/?format=api")
    assert (response.status_code, response.json()) == (404, {"error": "not_found", "detail": "Not found."})


def test_a_browser_that_also_accepts_anything_gets_json(world):
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    response = world.client("admin").get(f"/api/v1/commands/{world.a.command.pk}/", HTTP_ACCEPT=browser)
    assert (response.status_code, response["Content-Type"]) == (200, "application/json")
    assert response.json()["id"] == world.a.command.pk


@pytest.mark.parametrize("method", ["options", "post", "put", "patch", "delete"])
@pytest.mark.parametrize("path", ["/api/docs/", "/api/redoc/"])
def test_a_docs_page_answers_other_methods_than_get_with_a_json_405(client, db, path, method):
    response = getattr(client, method)(path)
    assert (response.status_code, response["Content-Type"]) == (405, "application/json")
    assert response.json()["error"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", ["/api/docs/", "/api/redoc/"])
@pytest.mark.parametrize("accept", ["text/html", "*/*", "text/html,application/xhtml+xml,*/*;q=0.8"])
def test_a_docs_page_is_html_for_get_and_head(client, db, path, accept):
    for method in (client.get, client.head):
        response = method(path, HTTP_ACCEPT=accept)
        assert (response.status_code, response["Content-Type"]) == (200, "text/html; charset=utf-8")


@pytest.mark.parametrize(
    ("path", "accept"),
    [
        ("/api/docs/", "application/json"),
        ("/api/redoc/", "application/json"),
        ("/api/docs/?format=json", "*/*"),
        ("/api/schema/", "text/html"),
        ("/api/schema/?format=html", "*/*"),
    ],
)
def test_a_docs_or_schema_error_is_json(client, db, path, accept):
    response = client.get(path, HTTP_ACCEPT=accept)
    assert 400 <= response.status_code < 500
    assert response["Content-Type"] == "application/json"
    assert set(response.json()) == {"error", "detail"}


def test_a_schema_post_is_a_json_405_and_its_options_still_answer(client, db):
    response = client.post("/api/schema/")
    assert (response.status_code, response.json()["error"]) == (405, "method_not_allowed")
    assert client.options("/api/schema/").status_code == 200


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        (None, "application/vnd.oai.openapi"),
        ("application/vnd.oai.openapi", "application/vnd.oai.openapi"),
        ("application/json", "application/json"),
        ("application/vnd.oai.openapi+json", "application/vnd.oai.openapi+json"),
    ],
)
def test_the_schema_keeps_its_own_renderers(client, db, accept, content_type):
    headers = {"HTTP_ACCEPT": accept} if accept else {}
    response = client.get("/api/schema/", **headers)
    assert response.status_code == 200
    assert response["Content-Type"].split(";")[0] == content_type
