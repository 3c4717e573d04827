import re

from django.conf import settings
from django.contrib import admin
from django.http import HttpResponsePermanentRedirect
from django.urls import Resolver404, include, path, re_path, resolve
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from ankusa_site import schema  # noqa: F401 - schema registers the token scheme
from ankusa_site.core import health
from ankusa_site.core.answers import JSON_PREFIXES, error, wants_json
from ankusa_site.core.metrics import metrics_view
from ankusa_site.core.renderers import JSONRenderer
from ankusa_site.favicon import favicon
from commands.intake.hooks import receive
from commands.staff.views import demo_receiver


class JsonErrors:
    """A drf-spectacular view whose errors are JSON, like every other answer under /api/: it
    renders them with its page's own renderer otherwise (YAML for the schema; for the docs pages an
    HTML template, or plain text when none fits)."""

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if getattr(response, "exception", False):
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response


class SchemaView(JsonErrors, SpectacularAPIView):
    def _get_version_parameter(self, request):
        # The API has one version, in its paths (v1). drf-spectacular would copy ?version= into the
        # Content-Disposition file name as it came: a control character in it was a 500 (gunicorn
        # refuses the header), a quote started a parameter of its own.
        return None


class DocsPage(JsonErrors):
    """A page for people, read with GET (and HEAD); any other method is a 405. DRF's OPTIONS
    answer would render its metadata through the page's template: a Swagger UI page without its
    script's name (TemplateDoesNotExist, a 500), a Redoc page that describes nothing."""

    http_method_names = ["get", "head"]


class SwaggerView(DocsPage, SpectacularSwaggerView):
    pass


class RedocView(DocsPage, SpectacularRedocView):
    pass


admin.site.site_header = "Ankusa"
admin.site.site_title = "Ankusa"
admin.site.index_title = "Operations"
admin.site.site_url = None  # no "View site": the site has no pages of its own besides these and /api/docs/
# No app list beside every page: it takes 300 px of a 1280 px laptop screen from every list (the
# breadcrumbs and the index lead everywhere it did).
admin.site.enable_nav_sidebar = False

urlpatterns = [
    # Providers' webhooks, first: the busiest route, and the resolver tries patterns in order. Also without the trailing slash: a POST redirected to add it would lose
    # its body, and providers are configured by people who may leave it out.
    path("hooks/<str:tenant>/<str:source>/", receive, name="hook"),
    path("hooks/<str:tenant>/<str:source>", receive),
    # With or without a slash: a probe configured either way finds them.
    re_path(r"^healthz/?$", health.healthz, name="healthz"),
    re_path(r"^readyz/?$", health.readyz, name="readyz"),
    re_path(r"^metrics/?$", metrics_view, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),
    path("admin/", admin.site.urls),
    # Each app owns its REST endpoints in <app>/api_urls.py.
    path("api/v1/", include("limits.api_urls")),
    path("api/v1/", include("queues.api_urls")),
    path("api/v1/", include("commands.staff.api_urls")),
    # The OpenAPI schema and two readers of it; their scripts come from drf-spectacular-sidecar's
    # static files (SWAGGER_UI_DIST = "SIDECAR"), so the pages work offline and load no CDN.
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path("api/docs/", SwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", RedocView.as_view(url_name="api-schema"), name="api-redoc"),
]

if settings.DEBUG:
    # The receiver of the demo's http connector (manage.py demo); never part of a production site.
    urlpatterns.append(path("demo/receiver/", demo_receiver, name="demo-receiver"))


@csrf_exempt
def no_endpoint(request, *args, **kwargs):
    """Any other path under /api/ or /hooks/: a JSON 404, in debug mode too (whose own 404 is an
    HTML page). A GET or HEAD missing the trailing slash of an endpoint is redirected to it, as
    Django does; any other method gets the 404 naming the right path: a 301 is followed with a GET,
    so a command POSTed there was dropped while the client saw 200 and a list (and in debug mode
    Django's refusal to redirect a POST was a 500)."""
    found = None
    if not request.path_info.endswith("/"):
        try:
            found = resolve(request.path_info + "/")
        except Resolver404:
            pass
    if found is None or found.func is no_endpoint:
        return error("not_found", f"No endpoint at {request.path}.", 404)
    if request.method in ("GET", "HEAD"):
        return HttpResponsePermanentRedirect(request.get_full_path(force_append_slash=True))
    detail = f"No endpoint at {request.path}. Its paths end with a slash: {request.path}/"
    return error("not_found", detail, 404)


# Last: only what no pattern above took, under the paths whose every answer is JSON.
_JSON_PATHS = "|".join(re.escape(prefix.strip("/")) for prefix in JSON_PREFIXES)
urlpatterns.append(re_path(rf"^(?:{_JSON_PATHS})/", no_endpoint))


def handler400(request, exception=None):
    if wants_json(request):
        return error("bad_request", "The request was refused as malformed.", 400)
    return defaults.bad_request(request, exception)


def handler404(request, exception=None):
    if wants_json(request):
        return error("not_found", f"No endpoint at {request.path}.", 404)
    return defaults.page_not_found(request, exception)


def handler500(request):
    if wants_json(request):
        return error("server_error", "The server failed to answer; the error was logged.", 500)
    return defaults.server_error(request)
