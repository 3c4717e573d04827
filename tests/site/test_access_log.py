"""gunicorn's access log never holds a secret sent in a URL (``ankusa_site.gunicorn_conf.AccessLog``):
a token refused in the query string was written whole to the log."""

from __future__ import annotations

import pytest

from ankusa_site.gunicorn_conf import masked_query, masked_target

pytestmark = [pytest.mark.django_db(transaction=True)]

# The default format, plus the headers a format might ask for.
FORMAT = '%(h)s "%(r)s" %(s)s q=%(q)s f="%(f)s" a=%({authorization}i)s c=%({cookie}i)s'


@pytest.mark.slow
def test_the_access_log_masks_tokens_in_the_url_the_referrer_and_the_headers(start_node, tmp_path):
    log = tmp_path / "access.log"
    node = start_node(workers=1, threads=2, args=("--access-logfile", str(log), "--access-logformat", FORMAT))
    node.request(
        "GET",
        "/api/v1/tenants/?token=SECRET-1&cursor=abc&api_key=SECRET-2&SECRET-3",
        headers={
            "Referer": "https://example.com/x?access_token=SECRET-4&page=2",
            "Authorization": "Bearer SECRET-5",
            "Cookie": "sessionid=SECRET-6",
        },
    )
    node.request("POST", "/hooks/acme/orders/?sig=SECRET-7", b"{}")
    node.stop()
    lines = log.read_text().splitlines()
    assert "SECRET" not in log.read_text()
    assert [line.split(" ", 1)[1] for line in lines if "/readyz" not in line] == [
        '"GET /api/v1/tenants/?token=***&cursor=abc&api_key=***&*** HTTP/1.1" 401 '
        'q=token=***&cursor=abc&api_key=***&*** f="https://example.com/x?access_token=***&page=2" a=*** c=***',
        '"POST /hooks/acme/orders/?sig=*** HTTP/1.1" 404 q=sig=*** f="-" a=- c=-',
    ]


def test_a_query_keeps_its_names_and_what_is_not_secret():
    assert masked_query("") == ""
    assert masked_query("cursor=abc&state=failed") == "cursor=abc&state=failed"
    assert masked_query("Token=a&X-Signature=b&password=c&secret=d&code=e") == (
        "Token=***&X-Signature=***&password=***&secret=***&code=***"
    )
    assert masked_query("=value&bare&&a=") == "***&***&&a="
    assert masked_target("/p") == "/p"
    assert masked_target("/p?token=a#frag") == "/p?token=***#frag"
