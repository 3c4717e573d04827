"""What drf-spectacular cannot guess about the API: how our Bearer tokens authenticate.

Imported by ``ankusa_site.urls``, so the extension is registered before any schema is built.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "limits.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "ank_<key id>_<secret>",
            "description": "A tenant's token (its own data only) or a staff user's (that user's permissions).",
        }


# Answers any /api/v1/ operation may give, whatever it does, all in the JSON error shape: a bad
# query or body (400), no or a bad token (401), a permission or a tenant boundary (403), an id or
# cursor that names nothing (404), an Accept that takes no JSON (406), a body that stalled (408),
# too large (413) or not JSON (415).
COMMON_ERRORS = {
    "400": "Malformed or invalid input.",
    "401": "No credentials, or a bad token.",
    "403": "Not allowed for this caller.",
    "404": "No such row (another tenant's is answered the same), or an invalid cursor.",
    "406": "The Accept header takes no JSON, the only thing this API answers.",
}
WITH_BODY = {"post", "put", "patch"}


def add_common_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: declare the common error answers on every operation."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            wanted = dict(COMMON_ERRORS)
            if method in WITH_BODY:
                wanted["408"] = "The body did not all arrive within the site's time (ANKUSA_BODY_TIMEOUT_S)."
                wanted["413"] = "The body is larger than the site reads."
                wanted["415"] = "The body is not JSON (send Content-Type: application/json)."
            for status, description in wanted.items():
                responses.setdefault(status, {"description": description, "content": error})
    return result
