"""``/favicon.ico``: a 16 × 16 icon made here (a square in the console's colour), so a browser's
automatic request gets an icon instead of a 404 — no file to collect, nothing fetched elsewhere."""

from __future__ import annotations

import struct
import zlib

from django.http import HttpResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe

SIZE = 16
COLOUR = (0x41, 0x76, 0x90)  # the admin's header blue


def _png(size: int, rgb: tuple[int, int, int]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    # A filled square with a one-pixel transparent border, RGBA, no interlace.
    rows = []
    for y in range(size):
        row = bytearray([0])  # filter: none
        for x in range(size):
            inside = 0 < x < size - 1 and 0 < y < size - 1
            row += bytes([*rgb, 255]) if inside else bytes(4)
        rows.append(bytes(row))
    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def _ico(png: bytes, size: int) -> bytes:
    # An ICO holding one PNG image (every browser since 2009 reads it).
    directory = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", size, size, 0, 0, 1, 32, len(png), 6 + 16)
    return directory + entry + png


ICON = _ico(_png(SIZE, COLOUR), SIZE)


@require_safe
@cache_control(max_age=86400, public=True)
def favicon(request):
    return HttpResponse(ICON, content_type="image/x-icon")
