"""gunicorn believes forwarded headers only from ``ANKUSA_TRUSTED_PROXIES`` (``ankusa_site.gunicorn_conf``):
empty by default, so a client on loopback is a client like any other; and from nobody a
``SCRIPT_NAME`` or ``PATH_INFO`` header (the site is served at the root)."""

from __future__ import annotations

import ipaddress
import re

import pytest
from django.core.exceptions import ImproperlyConfigured

from ankusa_site.core.env import env_networks

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HTTPS = {"ANKUSA_HTTPS": "1"}


@pytest.mark.parametrize("trusted", ["", "127.0.0.1"], ids=["untrusted", "trusted"])
def test_no_peer_sets_the_script_name(start_node, trusted):
    node = start_node(workers=1, threads=2, ANKUSA_TRUSTED_PROXIES=trusted)
    for prefix in ("/x", "/", "/healthz"):
        status, body, _ = node.request("GET", "/healthz", headers={"SCRIPT_NAME": prefix})
        assert (prefix, status, body["status"]) == (prefix, 200, "ok")
        status, body, _ = node.request("GET", "/api/v1/nowhere/", headers={"SCRIPT_NAME": prefix})
        assert (status, body) == (404, {"error": "not_found", "detail": "No endpoint at /api/v1/nowhere/."})


def test_a_client_that_is_no_trusted_proxy_cannot_claim_https(start_node):
    node = start_node(workers=1, threads=2, **HTTPS)  # ANKUSA_TRUSTED_PROXIES unset: nobody
    for header in ("X-Forwarded-Proto", "X-Forwarded-Ssl", "X-Forwarded-Protocol"):
        value = {"X-Forwarded-Proto": "https", "X-Forwarded-Ssl": "on", "X-Forwarded-Protocol": "ssl"}[header]
        status, _, headers = node.request("GET", "/admin/login/", headers={header: value})
        assert (status, headers["Location"]) == (301, f"https://127.0.0.1:{node.port}/admin/login/")


def test_a_trusted_proxy_says_the_scheme_was_https(start_node):
    node = start_node(workers=1, threads=2, ANKUSA_TRUSTED_PROXIES="10.0.0.0/8,127.0.0.1", **HTTPS)
    status, _, headers = node.request("GET", "/admin/login/", headers={"X-Forwarded-Proto": "https"})
    assert (status, headers["Strict-Transport-Security"]) == (200, "max-age=31536000")
    status, _, headers = node.request("GET", "/admin/login/")  # and plain HTTP goes to HTTPS
    assert (status, headers["Location"]) == (301, f"https://127.0.0.1:{node.port}/admin/login/")


def test_a_proxy_in_another_network_is_not_trusted(start_node):
    node = start_node(workers=1, threads=2, ANKUSA_TRUSTED_PROXIES="10.0.0.5", **HTTPS)
    status, _, headers = node.request("GET", "/admin/login/", headers={"X-Forwarded-Proto": "https"})
    assert (status, headers["Location"]) == (301, f"https://127.0.0.1:{node.port}/admin/login/")


def test_trusted_proxies_are_addresses_or_networks():
    assert env_networks("P", [], environ={"P": " 127.0.0.1, ::1 ,10.0.0.0/8"}) == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
        ipaddress.ip_network("10.0.0.0/8"),
    )
    assert env_networks("P", [], environ={}) == ()
    for bad in ("*", "localhost", "10.0.0.1/8"):
        with pytest.raises(ImproperlyConfigured, match=re.escape(f"P: '{bad}' is not a network")):
            env_networks("P", [], environ={"P": bad})
