"""Static files (the API documentation page's Swagger UI assets, shipped by drf-spectacular-sidecar),
served by the application itself so the one-command product needs no web server or CDN in front."""

from __future__ import annotations

import mimetypes

from django.contrib.staticfiles import finders
from django.http import FileResponse, Http404, HttpRequest


def static_file(request: HttpRequest, path: str) -> FileResponse:
    if ".." in path.split("/"):
        raise Http404("no such file")
    found = finders.find(path)
    if not found or isinstance(found, list):
        raise Http404("no such file")
    content_type, _ = mimetypes.guess_type(str(found))
    response = FileResponse(open(found, "rb"), content_type=content_type or "application/octet-stream")  # noqa: SIM115
    response["Cache-Control"] = "public, max-age=86400"
    return response
