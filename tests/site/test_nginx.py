"""The deploy's nginx (``deploy/nginx/ankusa.conf``) in front of real gunicorn: what it tells the site
about the client, what it refuses itself (as the site's JSON errors), what it logs."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.site.proxy import Nginx, client_context

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The deploy's environment (deploy/ankusa.env.example): HTTPS, nginx on loopback trusted.
DEPLOY = {"ANKUSA_HTTPS": "1", "ANKUSA_TRUSTED_PROXIES": "127.0.0.1", "ANKUSA_METRICS_TOKEN": "t0ken"}


def ask(port: int, method: str, path: str, body: bytes | None = None, headers=None, *, tls: bool = True):
    """``(status, json or None, headers)`` over a new connection to nginx."""
    if tls:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=client_context())
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        return response.status, data, dict(response.getheaders())
    finally:
        conn.close()


@pytest.fixture
def proxied(start_node, tmp_path):
    node = start_node(workers=1, threads=4, **DEPLOY)
    with Nginx(node.port, tmp_path / "nginx") as nginx:
        yield nginx


def test_the_site_sees_https_from_nginx_whatever_the_client_claims(proxied):
    for claim in ({}, {"X-Forwarded-Proto": "http", "X-Forwarded-Ssl": "off", "Forwarded": "proto=http"}):
        status, _, headers = ask(proxied.https_port, "GET", "/admin/login/", headers=claim)
        # No redirect to HTTPS: the site believed nginx's X-Forwarded-Proto, and only it.
        assert (status, headers["Strict-Transport-Security"]) == (200, "max-age=31536000")


def test_plain_http_is_sent_to_https(proxied):
    status, _, headers = ask(proxied.http_port, "GET", "/api/v1/tenants/?x=1", tls=False)
    assert (status, headers["Location"]) == (301, "https://127.0.0.1/api/v1/tenants/?x=1")


def test_a_script_name_header_from_the_client_goes_nowhere(proxied):
    status, body, _ = ask(proxied.https_port, "GET", "/api/v1/nowhere/", headers={"SCRIPT_NAME": "/x"})
    assert (status, body) == (404, {"error": "not_found", "detail": "No endpoint at /api/v1/nowhere/."})


def test_a_body_over_the_site_limit_is_a_json_413_from_nginx(proxied, settings):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    status, body, headers = ask(proxied.https_port, "POST", "/hooks/acme/orders/", b"x" * (limit + 1))
    assert (status, headers["Content-Type"], body) == (
        413,
        "application/json",
        {"error": "too_large", "detail": f"The body is larger than this site reads ({limit} bytes)."},
    )


def test_metrics_through_nginx_need_the_token(proxied):
    port = proxied.https_port
    status, body, headers = ask(port, "GET", "/metrics")
    assert (status, headers["Content-Type"], body["error"]) == (403, "application/json", "forbidden")
    assert ask(port, "GET", "/metrics", headers={"Authorization": "Bearer nope"})[0] == 403
    assert ask(port, "GET", "/metrics/", headers={"Authorization": "Bearer t0ken"})[0] == 200


def test_the_access_log_holds_no_query_string(proxied):
    ask(
        proxied.https_port,
        "GET",
        "/api/v1/tenants/?token=SECRET-1&cursor=x",
        headers={"Referer": "/?t=SECRET-2"},
    )
    proxied.stop()  # nginx writes its log as it goes; stopped, it has written all of it
    log = proxied.access_log()
    assert '"GET /api/v1/tenants/ HTTP/1.1" 401' in log
    assert "SECRET" not in log
