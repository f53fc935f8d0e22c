"""The management API's JSON parser: DRF's, with the nesting depth bounded before the body is decoded.

The stdlib decoder recurses once per nested array or object, so a body of 50,000 ``[`` ends in a
RecursionError (a 500). Nothing this API takes is nested more than a few levels; the depth is counted on the
raw bytes, outside strings, and anything deeper is refused with a 400 naming the problem before ``json``
sees it.
"""

from __future__ import annotations

import io
import re
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_JSON_DEPTH = 32

# A JSON string (escapes included) or one bracket; strings are matched whole so that brackets inside them
# do not count. A string left open runs to the end of the body: matching it there, rather than failing and
# trying again from each later quote, keeps the scan linear.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)
_OPENING = frozenset(b"[{")


def json_depth_exceeds(data: bytes, limit: int) -> bool:
    """Whether the arrays and objects of ``data`` nest deeper than ``limit``. For text that is not JSON the
    answer only bounds what a parser could reach before it fails."""
    depth = 0
    for match in _TOKENS.finditer(data):
        first = match.group()[0]
        if first in _OPENING:
            depth += 1
            if depth > limit:
                return True
        elif first != 0x22:  # a closing bracket (a string starts with '"')
            depth -= 1
    return False


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser with a bounded nesting depth (and the body size Django allows for form data)."""

    max_depth = MAX_JSON_DEPTH

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        if stream is None:
            return super().parse(stream, media_type, parser_context)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        data = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(data) > limit:
            raise ParseError(
                f"JSON parse error - the body is over {limit} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)"
            )
        if json_depth_exceeds(data, self.max_depth):
            raise ParseError(
                f"JSON parse error - arrays and objects nested more than {self.max_depth} levels deep"
            )
        return super().parse(io.BytesIO(data), media_type, parser_context)
