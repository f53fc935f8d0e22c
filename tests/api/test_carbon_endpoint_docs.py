"""The OpenAPI description of ``/api/v1/carbon`` names what its figures cover: Scope 2 is ISO 14064-1
Category 2 (owned and colocated sites), cloud inference is Scope 3 category 1 (Category 4), and a figure over
both is a total, never "Scope 2"."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_the_carbon_endpoint_description_labels_scopes_and_totals_right(client) -> None:
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/carbon"]["get"]
    text = " ".join(str(operation.get(key, "")) for key in ("summary", "description"))
    assert "Scope 2" in text and "Category 2" in text
    assert "Scope 3 category 1" in text and "Category 4" in text
    assert "total" in text.lower()
    # "Scope 2" is never the name of the whole figure.
    assert not text.startswith("Scope 2 location- and market-based")
    assert "Scope 2 location- and market-based side by side" not in text
