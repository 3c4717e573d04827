"""The API's request parser (``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``).

A body is refused here, whole, when it holds what no database stores: a NUL character or a lone
surrogate anywhere (a key or a value), a number too large for a float (``1e400`` reads as
infinity), nesting past ``commands.intake.MAX_JSON_DEPTH`` — the rule the webhook intake applies
(``commands.intake.unstorable``), so both answer the same document the same way. Left to the
serializers, such text reached PostgreSQL (a DataError on a NUL slug) or came back in a message
("is not a valid choice", "Unknown field") that no UTF-8 response can carry, both 500s. A refused
body is a 400 ``parse_error`` that says why, and nothing of it is echoed.
"""

from __future__ import annotations

from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, which refuses what the intake refuses (above), and whose document nested
    too deep for Python's parser is a 400, not a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        # Imported here: DRF reads this setting while ``rest_framework.views`` is first imported,
        # which may be before the apps (and commands.intake's models) are loaded.
        from commands.intake import unstorable

        try:
            document = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deep.") from None
        problem = unstorable(document)
        if problem:
            raise exceptions.ParseError(problem)
        return document
