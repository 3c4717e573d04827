"""``manage.py nginx_conf``: the deploy's nginx configuration, filled in from the site's settings."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import CommandError, call_command

from ankusa_site.management.commands.nginx_conf import render


def test_the_body_limit_and_the_host_names_come_from_the_settings(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    settings.ALLOWED_HOSTS = ["ankusa.example.com", "hooks.example.com", ".example.org"]
    out = io.StringIO()
    call_command("nginx_conf", stdout=out)
    conf = out.getvalue()
    assert re.search(r"\$\{[A-Z_]+\}", conf) is None
    assert re.findall(
        r"^\s*(client_max_body_size|server_name|server|ssl_certificate) (.*);$", conf, re.M
    ) == [
        ("server", "127.0.0.1:8000"),
        ("server_name", "ankusa.example.com hooks.example.com"),
        ("server_name", "ankusa.example.com hooks.example.com"),
        ("ssl_certificate", "/etc/letsencrypt/live/ankusa.example.com/fullchain.pem"),
        ("client_max_body_size", "2048"),
    ]


def test_a_placeholder_nobody_fills_is_an_error(tmp_path):
    template = tmp_path / "t.conf"
    template.write_text("listen ${HTTP_LISTEN}; proxy_set_header Host $host; ${NEW_ONE}\n")
    with pytest.raises(CommandError, match=r"t.conf needs values for: HTTP_LISTEN, NEW_ONE\."):
        render({}, template)
    assert (
        render({"HTTP_LISTEN": "80", "NEW_ONE": "x"}, template)
        == "listen 80; proxy_set_header Host $host; x\n"
    )
