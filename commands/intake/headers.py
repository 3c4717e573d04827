"""A request's headers by case-insensitive name, read once per webhook.

The verifier, the event key and the headers a delivery keeps all look headers up. Django's
``request.headers`` title-cases every name of the WSGI environ when first read, and a lookup
lowers the name again each time; a webhook reads this map instead, built in one pass over the
environ (``Headers.from_environ``). Any other mapping of headers is accepted too
(``Headers.of``), so tests and callers outside a request pass a plain dict.
"""

from __future__ import annotations

from collections.abc import Mapping

# The two headers a WSGI environ holds without the HTTP_ prefix (PEP 3333).
_UNPREFIXED = {"CONTENT_TYPE": "content-type", "CONTENT_LENGTH": "content-length"}


class Headers:
    __slots__ = ("_lower",)

    def __init__(self, headers: Mapping[str, str]):
        self._lower = {str(name).lower(): value for name, value in headers.items()}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Headers:
        headers = cls({})
        lower = headers._lower
        for key, value in environ.items():
            if key.startswith("HTTP_"):
                lower[key[5:].replace("_", "-").lower()] = value
            elif key in _UNPREFIXED:
                lower[_UNPREFIXED[key]] = value
        return headers

    @classmethod
    def of(cls, headers: Mapping[str, str] | Headers) -> Headers:
        return headers if isinstance(headers, Headers) else cls(headers)

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of header ``name`` (any case), as sent."""
        return self._lower.get(name.lower(), default)

    def stripped(self, name: str) -> str | None:
        """The value without surrounding blanks; None when the header is absent."""
        value = self._lower.get(name.lower())
        return None if value is None else str(value).strip()
