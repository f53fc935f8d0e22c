"""One table of limits (inference/limits.py) serves the gateway's codec and the job checks; the database
columns that store what a client sent must be exactly that wide, so a value the edge accepts always fits
its column and a column cannot be narrowed without the check following (issue 22)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import models

from inference import limits, variants
from jobs import inputs

COLUMNS = sorted(limits.COLUMN_LIMITS.items())


@pytest.mark.parametrize(("column", "limit"), COLUMNS, ids=[".".join(c) for c, _ in COLUMNS])
def test_each_column_fed_by_a_request_is_exactly_as_wide_as_the_edge_limit(
    column: tuple[str, str, str], limit: int
) -> None:
    app_label, model_name, field_name = column
    field = apps.get_model(app_label, model_name)._meta.get_field(field_name)
    assert isinstance(field, models.CharField)
    assert field.max_length == limit, (
        f"{'.'.join(column)} is {field.max_length} wide, the edge allows {limit}"
    )


def test_the_table_covers_the_request_id_model_version_and_variant_columns() -> None:
    covered = set(limits.COLUMN_LIMITS)
    for model_name in ("LedgerRequest", "LedgerBatch"):
        for field_name in ("model", "version", "variant"):
            assert ("ledger", model_name, field_name) in covered
    assert ("ledger", "LedgerRequest", "client_request_id") in covered
    assert ("jobs", "Job", "model") in covered and ("jobs", "Job", "version") in covered


def test_the_job_checks_and_the_variant_check_use_the_table() -> None:
    assert variants.MAX_LABEL == limits.VARIANT_MAX_LENGTH
    longest_name = "m" * limits.MODEL_NAME_MAX_LENGTH
    assert inputs.MODEL_NAME_PATTERN.fullmatch(longest_name)
    assert not inputs.MODEL_NAME_PATTERN.fullmatch(longest_name + "m")
    assert inputs.VERSION_PATTERN.fullmatch("1" * min(18, limits.MODEL_VERSION_MAX_LENGTH))
    assert not inputs.VERSION_PATTERN.fullmatch("1" * (limits.MODEL_VERSION_MAX_LENGTH + 1))
