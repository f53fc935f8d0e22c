"""Request checks every view would otherwise repeat."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse


class RejectNulCharacters:
    """A NUL character in a query parameter is refused with a 400 naming the parameter.

    PostgreSQL text cannot hold NUL, so such a value used as a filter fails inside the database (a 500);
    SQLite would accept it. DRF's and Django's form fields refuse NUL in bodies already; this covers the
    query strings that views read directly. (Bodies are left alone: reading them here would consume the
    stream DRF's parsers read.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for key, values in request.GET.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                message = f"the query parameter {key.replace(chr(0), '')!r} contains a NUL character"
                if request.path.startswith("/api/"):
                    return JsonResponse({"error": message}, status=400)
                return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
        return self.get_response(request)
