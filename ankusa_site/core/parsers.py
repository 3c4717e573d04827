"""The API's request parser (``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``).

A body is refused here, whole, when it is not UTF-8 JSON or holds what no database stores: a NUL
character or a lone surrogate anywhere (a key or a value), a number too large for a float
(``1e400``) or with more digits after the point than PostgreSQL keeps, nesting past
``MAX_JSON_DEPTH`` — the rule the webhook intake applies (``ankusa_site.core.strict_json``), so
both answer the same document the same way. Left to the serializers, such text reached PostgreSQL (a DataError on a NUL slug) or came back in a message
("is not a valid choice", "Unknown field") that no UTF-8 response can carry, both 500s. A refused
body is a 400 ``parse_error`` that says why, and nothing of it is echoed.
"""

from __future__ import annotations

from rest_framework import exceptions, parsers

from ankusa_site.core.middleware import body_encoding_problem
from ankusa_site.core.strict_json import Refusal, parse_json


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, parsing by the intake's own rule (``ankusa_site.core.strict_json``): the
    same document is refused, or read, alike by the REST API and a webhook."""

    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        if request is not None and (problem := body_encoding_problem(request.META)):
            raise exceptions.UnsupportedMediaType(media_type, detail=problem)
        parsed = parse_json(stream.read())
        if isinstance(parsed, Refusal):
            raise exceptions.ParseError(parsed.detail)
        return parsed[0]
