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
