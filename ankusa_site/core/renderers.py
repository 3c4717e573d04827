"""The API's renderer (``REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"]``): JSON, and nothing else.

JSON only: the README promises ``{"error": code, "detail": text}`` for every error, and DRF's
browsable API (its default second renderer) answered ``Accept: text/html`` or ``?format=api``
with an HTML page instead. Now ``Accept: text/html`` alone is a JSON 406, ``?format=api`` a JSON
404 (DRF's answer to a format it has no renderer for); a browser's ``*/*`` gets JSON. The schema
and its docs pages set their own renderers (``ankusa_site.urls``).

UTF-8 cannot encode a lone surrogate, which a parsed JSON string may hold (``"\\ud800"``); DRF's
renderer writes text unescaped, so such text anywhere in an answer was a UnicodeEncodeError after
the view had returned, a 500 no exception handler sees. The parser refuses those bodies
(``ankusa_site.core.parsers``); if such text reaches an answer anyway, it is written escaped.
"""

from __future__ import annotations

from rest_framework import renderers


class JSONRenderer(renderers.JSONRenderer):
    """DRF's JSON renderer (unescaped UTF-8), which escapes everything past ASCII when UTF-8
    cannot encode the text."""

    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            return AsciiJSONRenderer().render(data, accepted_media_type, renderer_context)


class AsciiJSONRenderer(renderers.JSONRenderer):
    """JSON with every character past ASCII escaped (``\\ud800``): always encodable."""

    ensure_ascii = True
