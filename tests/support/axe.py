"""axe-core (vendored in dashboard/static/vendor/axe-core) run on a page open in the browser tests."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

AXE_URL = "/static/vendor/axe-core/axe.min.js"


def serious_violations(page: Page) -> list[str]:
    """The serious and critical violations axe-core finds on ``page``, each with up to three of its elements."""
    page.add_script_tag(url=AXE_URL)
    result: dict[str, Any] = page.evaluate(
        "async () => await axe.run(document, {resultTypes: ['violations']})"
    )
    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes'][:3]]}"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]
