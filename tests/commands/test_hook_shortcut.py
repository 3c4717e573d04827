"""The site's handler (``ankusa_site.handlers``): a webhook's shortcut past the URL resolver and the
middleware that does nothing for it answers as the whole stack does, but for the session and CSRF
cookies (and ``Vary: Cookie``) those middleware add to an answer whose request sent cookies."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import Resolver404, resolve
from django.utils.decorators import async_only_middleware
from django.utils.deprecation import MiddlewareMixin

from ankusa_site.handlers import HOOK_PATH, SKIPPED_FOR_HOOKS, SiteWSGIHandler, hook_middleware
from commands.intake import hooks
from commands.models import Delivery
from tests.commands.conftest import github_headers
from tests.conftest import SiteClient

# The headers whose values differ from one request to the next.
VARYING = {"RateLimit"}


def test_every_middleware_a_webhook_skips_is_in_the_stack_and_named_with_why():
    assert set(SKIPPED_FOR_HOOKS) <= set(settings.MIDDLEWARE)
    assert all(why for why in SKIPPED_FOR_HOOKS.values())


def test_a_webhook_still_goes_through_the_middleware_that_acts_on_it_in_the_stacks_order():
    assert hook_middleware() == [
        "ankusa_site.core.middleware.body_timeout",
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/hooks/acme/orders/",
        "/hooks/acme/orders",
        "/hooks/a.b/c d/",
        "/hooks/acme/orders//",
        "/hooks/acme/orders/more/",
        "/hooks/acme//",
        "/hooks//orders/",
        "/hooks/acme/",
        "/hooksx/acme/orders/",
        "/api/hooks/acme/orders/",
        "//hooks/acme/orders/",
    ],
)
def test_the_shortcut_takes_exactly_the_paths_the_urlconf_gives_the_hook_view(path):
    try:
        routed = resolve(path).func is hooks.receive
    except Resolver404:
        routed = False
    assert (HOOK_PATH.fullmatch(path) is not None) is routed


def request_kinds(body: bytes) -> dict[str, dict]:
    """Requests to the same source, one per kind of answer: the shortcut and the whole stack each
    get a fresh delivery id for the accepted one, and the same for the duplicate."""
    return {
        "accepted": {"delivery": None},
        "bad signature": {"delivery": "d-bad", "headers": {"X-Hub-Signature-256": "sha256=" + "0" * 64}},
        "not json": {"delivery": "d-text", "body": b"not json"},
        "unknown source": {"delivery": "d-404", "path": "/hooks/acme/nowhere/"},
        "hostile slug": {"delivery": "d-slug", "path": "/hooks/acme/<script>/"},
        "traversal": {"delivery": "d-dots", "path": "/hooks/acme/..%2f..%2fetc/"},
        "no slash": {"delivery": None, "path": "/hooks/acme/orders"},
        "unknown host": {"delivery": "d-host", "extra": {"HTTP_HOST": "attacker.example"}},
        "too large": {"delivery": "d-big", "extra": {"CONTENT_LENGTH": str(10**9)}},
        "chunked": {"delivery": None, "extra": {"HTTP_TRANSFER_ENCODING": "chunked"}},
    }


def send(client, kind: dict, delivery: str, body: bytes):
    body = kind.get("body", body)
    headers = {**github_headers(body, kind["delivery"] or delivery), **kind.get("headers", {})}
    path = kind.get("path", "/hooks/acme/orders/")
    return client.post(path, body, content_type="application/json", headers=headers, **kind.get("extra", {}))


def shape(response) -> tuple:
    data = json.loads(response.content)
    if "id" in data:
        data["id"] = "<id>"
    if "commands" in data:
        data["commands"] = len(data["commands"])
    headers = {name: value for name, value in response.items() if name not in VARYING}
    return response.status_code, data, headers


@pytest.mark.parametrize("kind", list(request_kinds(b"")))
def test_a_webhook_answers_the_same_through_the_shortcut_as_through_the_whole_stack(hook_source, kind):
    body = b'{"order": "A-1"}'
    spec = request_kinds(body)[kind]
    whole = send(Client(), spec, f"whole-{kind}", body)
    short = send(SiteClient(), spec, f"short-{kind}", body)
    shortcut = HOOK_PATH.fullmatch(short.wsgi_request.path_info) is not None
    assert (short.wsgi_request.resolver_match is None) is shortcut  # it took the shortcut, if it may
    assert shape(short) == shape(whole)


def test_a_duplicate_answers_the_same_through_the_shortcut_as_through_the_whole_stack(hook_source):
    body = b'{"order": "A-1"}'
    first = send(Client(), {"delivery": "dup"}, "", body)
    assert first.status_code == 202
    assert shape(send(SiteClient(), {"delivery": "dup"}, "", body)) == shape(
        send(Client(), {"delivery": "dup"}, "", body)
    )
    assert Delivery.objects.filter(event_key="dup").count() == 1


def test_other_paths_go_the_whole_way(hook_source):
    response = SiteClient().get("/healthz")
    assert response.status_code == 200
    assert response.wsgi_request.resolver_match is not None


def test_an_exception_in_the_view_is_the_sites_json_500_and_logged(hook_source, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(hooks, "find_route", broken)
    response = SiteClient(raise_request_exception=False).post(
        "/hooks/acme/orders/", b"{}", content_type="application/json"
    )
    assert response.status_code == 500
    assert response.json()["error"] == "server_error"
    assert any(record.name == "django.request" and record.exc_info for record in caplog.records)


def test_a_webhook_sending_cookies_gets_none_back_and_otherwise_the_same_answer(hook_source):
    body = b'{"order": "A-1"}'
    cookies = {"HTTP_COOKIE": "sessionid=x; csrftoken=bad!"}
    whole = send(Client(), {"delivery": "c-whole", "extra": cookies}, "", body)
    short = send(SiteClient(), {"delivery": "c-short", "extra": cookies}, "", body)
    assert whole.cookies and whole.has_header("Vary")  # what the session and CSRF middleware add
    assert not short.cookies and not short.has_header("Vary")
    status, data, headers = shape(whole)
    headers.pop("Vary")
    assert shape(short) == (status, data, headers)


class Viewing(MiddlewareMixin):
    def process_view(self, request, view, args, kwargs):
        return None


@async_only_middleware
def asynchronous(get_response):
    async def middleware(request):
        return await get_response(request)

    return middleware


def test_a_middleware_the_shortcut_would_not_call_stops_the_site_from_starting(settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.Viewing"]
    with pytest.raises(ImproperlyConfigured, match="process_view"):
        SiteWSGIHandler()


def test_a_middleware_that_cannot_run_synchronously_stops_the_site_from_starting(settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.asynchronous"]
    with pytest.raises(ImproperlyConfigured, match="cannot run synchronously"):
        SiteWSGIHandler()


def test_a_client_whose_handler_was_refused_tries_again_once_the_middleware_is_fixed(hook_source, settings):
    client = SiteClient()
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.Viewing"]
    with pytest.raises(ImproperlyConfigured):
        send(client, {"delivery": "retry-1"}, "", b"{}")
    settings.MIDDLEWARE = settings.MIDDLEWARE[:-1]
    assert send(client, {"delivery": "retry-2"}, "", b"{}").status_code == 202


def routing_elsewhere(get_response):
    def middleware(request):
        request.urlconf = "tests.commands.test_hook_shortcut"  # a urlconf with no webhooks
        return get_response(request)

    return middleware


urlpatterns = []


def test_a_webhook_whose_urlconf_a_middleware_changed_is_refused_not_served(hook_source, settings, caplog):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.routing_elsewhere"]
    response = send(SiteClient(raise_request_exception=False), {"delivery": "elsewhere"}, "", b"{}")
    assert response.status_code == 500
    assert Delivery.objects.count() == 0
    assert any("request.urlconf" in str(record.exc_info[1]) for record in caplog.records if record.exc_info)


def test_a_middleware_named_as_skipped_may_have_what_the_shortcut_does_not_call(settings, monkeypatch):
    monkeypatch.setitem(SKIPPED_FOR_HOOKS, f"{__name__}.Viewing", "a test's")
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.Viewing"]
    SiteWSGIHandler()
