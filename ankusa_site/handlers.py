"""The site's request handler: Django's, with a shorter way through for providers' webhooks.

:class:`HookShortcut` takes a webhook (``/hooks/<tenant>/<source>``, with or without the slash),
the request the site serves most, straight to ``commands.intake.hooks.receive`` through every middleware
of ``settings.MIDDLEWARE`` but those in :data:`SKIPPED_FOR_HOOKS`; every other request goes
Django's way. Guaranteed: a webhook's answer and headers are the whole stack's (but the session and
CSRF cookies and ``Vary: Cookie``, which the skipped middleware adds and a webhook does not need;
``tests/commands/test_hook_shortcut.py``), Django's signals, 4xx/5xx log lines and 500 page
included, and every error under ``/api/`` and ``/hooks/`` is JSON, ``DEBUG`` or not
(:func:`json_error_answer`). Not supported on the webhook's way: a middleware with the hooks it
never calls, an async-only one (the site does not start until it is skipped), or one that routes by
``request.urlconf`` (a 500). ``ankusa_site.wsgi`` serves with :class:`SiteWSGIHandler`; the tests'
``client`` fixture uses the same shortcut (``tests.conftest.SiteClient``).
``ANKUSA_STOCK_DJANGO=handler`` (``ankusa_site.core.stock``) turns the shortcut off: every request
then goes Django's way, JSON errors kept.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, MiddlewareNotUsed
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.utils.module_loading import import_string

from ankusa_site.core.answers import error, wants_json
from ankusa_site.core.stock import stock

# The paths of ``commands.intake.hooks.receive`` in ``ankusa_site.urls`` (``<str:…>`` is ``[^/]+``).
HOOK_PATH = re.compile(r"/hooks/([^/]+)/([^/]+)/?")

# Middleware that does nothing for a webhook, and why. A middleware added to settings.MIDDLEWARE
# takes webhooks too unless it is named here: the webhook's way is kept true to the whole stack.
SKIPPED_FOR_HOOKS = {
    "whitenoise.middleware.WhiteNoiseMiddleware": "it serves /static/ only",
    "django.contrib.sessions.middleware.SessionMiddleware": "the view reads no session and sets none",
    "ankusa_site.core.middleware.chunked_body": "the view reads a chunked body itself, up to the tenant's limit",
    "django.middleware.csrf.CsrfViewMiddleware": "the view is csrf_exempt and sets no CSRF cookie",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "a webhook is signed, not logged in",
    "django.contrib.messages.middleware.MessageMiddleware": "the view sends no messages",
}
# What a middleware on the webhook's way may not have: this way never calls them, so one that has
# them must be skipped or the site does not start (a middleware here also sees no
# request.resolver_match: nothing was resolved).
UNCALLED_HOOKS = ("process_view", "process_exception", "process_template_response")


def hook_middleware() -> list[str]:
    """The middleware a webhook goes through, outermost first."""
    return [path for path in settings.MIDDLEWARE if path not in SKIPPED_FOR_HOOKS]


def _chain(paths: list[str], view):
    """``view`` inside the middleware ``paths``, each layer's exceptions turned into responses, as
    Django's ``BaseHandler.load_middleware`` builds its chain (synchronous only)."""
    handler = convert_exception_to_response(view)
    for path in reversed(paths):
        middleware = import_string(path)
        if not getattr(middleware, "sync_capable", True):
            raise ImproperlyConfigured(
                f"{path} cannot run synchronously, as webhooks' way through the site does: "
                f"name it in ankusa_site.handlers.SKIPPED_FOR_HOOKS."
            )
        try:
            instance = middleware(handler)
        except MiddlewareNotUsed:
            continue
        uncalled = [name for name in UNCALLED_HOOKS if hasattr(instance, name)]
        if uncalled:
            raise ImproperlyConfigured(
                f"{path} has {', '.join(uncalled)}, which webhooks' way through the site does not call: "
                f"name it in ankusa_site.handlers.SKIPPED_FOR_HOOKS, or call it there."
            )
        handler = convert_exception_to_response(instance)
    return handler


def _hook(request):
    from commands.intake.hooks import receive

    # Refused with a 500 and a log line naming the cause, rather than served by a route the
    # middleware's urlconf may not have.
    if getattr(request, "urlconf", None) is not None:
        raise ImproperlyConfigured(
            "A middleware on webhooks' way set request.urlconf, which their shortcut does not follow: "
            "name it in ankusa_site.handlers.SKIPPED_FOR_HOOKS, or route webhooks another way."
        )
    tenant, source = HOOK_PATH.fullmatch(request.path_info).groups()
    return receive(request, tenant, source)


# The site's answers for what Django refuses itself, as ``ankusa_site.urls``' handlers give them.
DJANGO_ERRORS = {
    400: ("bad_request", "The request was refused as malformed."),
    403: ("forbidden", "The request was refused."),
    404: ("not_found", "No endpoint at {path}."),
    500: ("server_error", "The server failed to answer; the error was logged."),
}


def json_error_answer(request, response):
    """``response``, or in its place the site's JSON error of its status when it is an error that
    is not JSON on a path whose every answer must be.

    Why even with ``DEBUG`` on: Django answers what it refuses before any view (a ``Host`` not in
    ``ALLOWED_HOSTS``, an exception in a middleware) with its debug page, which shows the settings,
    the database's path and ``REDIS_URL``. The debug page stays for the admin's pages, where a
    developer reads it."""
    if response.status_code < 400 or not wants_json(request):
        return response
    if response.get("Content-Type", "").split(";")[0].strip().endswith("json"):
        return response
    status = response.status_code
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    code, detail = DJANGO_ERRORS.get(
        status, DJANGO_ERRORS[500] if status >= 500 else (phrase.lower().replace(" ", "_"), f"{phrase}.")
    )
    answer = error(code, detail.format(path=request.path), status)
    for name, value in response.items():  # Allow, Retry-After, Vary… say something of the refusal too
        if name.lower() not in ("content-type", "content-length"):
            answer[name] = value
    answer._resource_closers.extend(response._resource_closers)  # what Django closes after the answer
    return answer


class HookShortcut:
    """Mixed into a Django handler: webhooks skip the URL resolver and the middleware in
    ``SKIPPED_FOR_HOOKS``; every other request goes Django's way. Django's ``get_response`` runs
    around either (the urlconf, closing the request, the 4xx/5xx log line)."""

    def load_middleware(self, is_async=False):
        if stock("handler"):  # ANKUSA_STOCK_DJANGO: webhooks go Django's way too
            return super().load_middleware(is_async)
        # First: a refusal leaves the handler unloaded, and the test client tries again next time.
        hook = _chain(hook_middleware(), _hook)
        super().load_middleware(is_async)
        whole = self._middleware_chain

        def either(request):
            return hook(request) if HOOK_PATH.fullmatch(request.path_info) else whole(request)

        self._middleware_chain = either

    def get_response(self, request):
        return json_error_answer(request, super().get_response(request))


class SiteWSGIHandler(HookShortcut, WSGIHandler):
    pass
