"""Every error under ``/api/`` and ``/hooks/`` is JSON, ``DEBUG`` or not (``ankusa_site.handlers``):
a ``Host`` the site does not serve, refused before any view, was Django's debug page with ``DEBUG``
on — the settings, the database's path and ``REDIS_URL`` in clear."""

from __future__ import annotations

import pytest
from django.http import HttpResponseNotAllowed

from ankusa_site.handlers import json_error_answer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PATHS = ["/hooks/acme/orders/", "/hooks/acme/orders", "/api/v1/tenants/", "/api/v1/nowhere/"]


@pytest.mark.parametrize("debug", ["1", "0"], ids=["debug", "no-debug"])
def test_a_host_the_site_does_not_serve_is_a_json_400_on_the_json_paths(start_node, debug):
    node = start_node(workers=1, threads=2, DEBUG=debug)
    for path in PATHS:
        for method in ("GET", "POST"):
            status, body, headers = node.request(method, path, b"{}", {"Host": "evil.example"})
            assert (path, method, status, headers["Content-Type"], body) == (
                path,
                method,
                400,
                "application/json",
                {"error": "bad_request", "detail": "The request was refused as malformed."},
            )


def test_the_admin_keeps_the_debug_page_for_a_developer(start_node):
    node = start_node(workers=1, threads=2, DEBUG="1")
    conn_status, body, headers = node.request("GET", "/admin/login/", headers={"Host": "evil.example"})
    assert (conn_status, body, headers["Content-Type"]) == (400, None, "text/html; charset=utf-8")


def test_an_html_refusal_becomes_json_and_keeps_its_headers(rf):
    answer = json_error_answer(rf.get("/api/v1/x/"), HttpResponseNotAllowed(["POST"]))
    assert (answer.status_code, answer["Allow"], answer["Content-Type"], answer.content) == (
        405,
        "POST",
        "application/json",
        b'{"error": "method_not_allowed", "detail": "Method Not Allowed."}',
    )
    page = HttpResponseNotAllowed(["POST"])
    assert json_error_answer(rf.get("/admin/"), page) is page
