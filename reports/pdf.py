"""HTML -> PDF with WeasyPrint. The only module that imports WeasyPrint (heavy, with native libraries), so
nothing else pays its import time and a missing system library fails here with a readable message."""

from __future__ import annotations

from typing import Any


class PdfUnavailable(RuntimeError):
    pass


def html_to_document(html: str) -> Any:
    """The laid-out document (WeasyPrint's ``Document``: its pages and their layout boxes) the PDF is
    written from; the layout tests walk it."""
    try:
        from weasyprint import HTML
    except (ImportError, OSError) as exc:  # OSError: Pango/HarfBuzz missing on the system
        raise PdfUnavailable(
            f"WeasyPrint cannot be loaded ({exc}); install it and the Pango library"
        ) from exc
    return HTML(string=html).render()


def html_to_pdf(html: str) -> bytes:
    pdf = html_to_document(html).write_pdf()
    if pdf is None:
        raise PdfUnavailable("WeasyPrint produced no PDF")
    return bytes(pdf)
