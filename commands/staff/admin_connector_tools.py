"""The connector page's tools (``commands.staff.connector_tools``): send a test, add and drop signing
secrets. Mixed into ``ConnectorAdmin``; each is a POST to a URL of its own under the connector's.

* **Send a test** answers on a page of its own: status, outlook, time taken and an excerpt of the
  body; a second one within a second is refused there with a 429.
* **Add a signing secret** renders the new secret on the answer to that POST, the one time it is
  shown: never through a message (a message rides in a cookie or the session) and never a redirect.
  Afterwards the page shows each secret by id and hint only (``whsec_…abcd``).
* **Drop** removes one, with a message, back on the connector's page.

Viewers see the hints and no buttons; a POST without ``change_connector`` is a 403. Anything that
is not a connector's id is a 404; a GET on these URLs is a 405.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from ankusa_site.core.admin import parse_id
from commands.models import Connector
from commands.staff import connector_tools

FIELDSET = ("Signing (Standard Webhooks)", {"fields": ["signing"]})


class ConnectorTools:
    """``ConnectorAdmin``'s tools: its URLs, views, the page's buttons and the signing field."""

    def get_urls(self):
        wrap = self.admin_site.admin_view  # type: ignore[attr-defined]
        return [
            path(
                "<str:object_id>/send-test/", wrap(self.send_test_view), name="commands_connector_send_test"
            ),
            path(
                "<str:object_id>/signing-secrets/add/",
                wrap(self.add_signing_secret_view),
                name="commands_connector_add_signing_secret",
            ),
            path(
                "<str:object_id>/signing-secrets/<str:key_id>/drop/",
                wrap(self.drop_signing_secret_view),
                name="commands_connector_drop_signing_secret",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        return [*fieldsets, FIELDSET] if obj is not None else fieldsets

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "signing"]  # type: ignore[misc]

    @admin.display(description="signing secrets")
    def signing(self, connector: Connector):
        keys = connector_tools.signing_keys(connector)
        if not keys:
            return "none: sends are not signed"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li><code>{}</code> · id {} · added {}</li>",
                ((k["hint"], k["id"], k["added_at"]) for k in keys),
            ),
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        connector = self._connector(object_id, required=False)
        if connector is not None:
            may = self.has_change_permission(request, connector)  # type: ignore[attr-defined]
            extra_context = {
                **(extra_context or {}),
                "connector_tools": may,
                "signing_keys": connector_tools.signing_keys(connector),
                "signs": connector.kind == "http",
            }
        return super().change_view(request, object_id, form_url, extra_context)  # type: ignore[misc]

    # --- the tools -------------------------------------------------------------------------------

    def _connector(self, object_id, *, required: bool = True) -> Connector | None:
        pk = parse_id(object_id)
        connector = Connector.objects.select_related("tenant").filter(pk=pk).first() if pk else None
        if connector is None and required:
            raise Http404("No such connector.")
        return connector

    def _changeable(self, request, object_id) -> Connector:
        connector = self._connector(object_id)
        assert connector is not None
        if not self.has_change_permission(request, connector):  # type: ignore[attr-defined]
            raise PermissionDenied
        return connector

    def _page(self, connector: Connector) -> str:
        return reverse("admin:commands_connector_change", args=[connector.pk])

    def _context(self, request, connector: Connector, title: str) -> dict:
        return {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": title,
            "opts": Connector._meta,
            "connector": connector,
            "connector_url": self._page(connector),
        }

    def send_test_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        connector = self._changeable(request, object_id)
        context = self._context(request, connector, f"Test send to {connector}")
        try:
            context["answer"] = connector_tools.send_test(connector, by=request.user, via="admin")
        except connector_tools.TooSoon as refused:
            context["refused"] = str(refused)
            return TemplateResponse(request, "admin/commands/connector/test_answer.html", context, status=429)
        return TemplateResponse(request, "admin/commands/connector/test_answer.html", context)

    def add_signing_secret_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        connector = self._changeable(request, object_id)
        try:
            secret, shown = connector_tools.add_signing_secret(connector, by=request.user, via="admin")
        except ValidationError as exc:
            for problem in exc.messages:
                self.message_user(request, problem, messages.ERROR)  # type: ignore[attr-defined]
            return HttpResponseRedirect(self._page(connector))
        context = {
            **self._context(request, connector, "Signing secret made"),
            "secret": secret,
            "shown": shown,
            "count": len(connector.signing_secrets),
        }
        # Rendered here, not redirected with a message: the secret exists in this response only
        # (which the admin's never_cache keeps out of caches).
        return TemplateResponse(request, "admin/commands/connector/signing_secret.html", context)

    def drop_signing_secret_view(self, request, object_id, key_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        connector = self._changeable(request, object_id)
        try:
            dropped = connector_tools.drop_signing_secret(
                connector, key_id[:16], by=request.user, via="admin"
            )
        except connector_tools.UnknownSecret as exc:
            self.message_user(request, str(exc), messages.ERROR)  # type: ignore[attr-defined]
        else:
            left = len(connector.signing_secrets)
            self.message_user(  # type: ignore[attr-defined]
                request,
                f"Dropped signing secret {dropped['id']} ({dropped['hint']}): "
                + (f"{left} still sign." if left else "sends are no longer signed."),
                messages.SUCCESS,
            )
        return HttpResponseRedirect(self._page(connector))
