"""The limits of what a client may send, in one table that the codec, the job checks and the variant check use.

A request's values end up in database columns (the ledger's request and batch records, a job's row): a value
wider than its column is accepted by SQLite but makes PostgreSQL refuse the whole drain transaction, again on
every retry, so the ledger stops. Checking at the edge against the same numbers the columns declare keeps the
two together; ``COLUMN_LIMITS`` names each column, and tests/jobs/test_edge_limits_match_columns.py compares
it with the Django models (this module imports no Django).

The tensor limits bound what the codec will lay out before it looks at the data: numpy refuses more than 64
dimensions (32 before numpy 2), and a shape whose dimensions multiply past what an array can address makes it raise (even with a
zero dimension, which it checks the same way).
"""

from __future__ import annotations

from typing import Final

REQUEST_ID_MAX_LENGTH: Final = 256  # the request's "id", stored as the ledger's client_request_id
MODEL_NAME_MAX_LENGTH: Final = 128
MODEL_VERSION_MAX_LENGTH: Final = 32
VARIANT_MAX_LENGTH: Final = 64  # the config's "variant" parameter, recorded with each batch and request
# A granular certificate's id and source label, from an import of hourly certificates (carbon.certificate_csv).
CERTIFICATE_ID_MAX_LENGTH: Final = 100
ENERGY_SOURCE_MAX_LENGTH: Final = 32
# The person responsible for an organization's GHG reports, set in the dashboard's settings.
RESPONSIBLE_PERSON_MAX_LENGTH: Final = 200

# (app label, model, field) -> the largest number of characters the edge lets into it.
COLUMN_LIMITS: Final[dict[tuple[str, str, str], int]] = {
    ("ledger", "LedgerRequest", "client_request_id"): REQUEST_ID_MAX_LENGTH,
    ("ledger", "LedgerRequest", "model"): MODEL_NAME_MAX_LENGTH,
    ("ledger", "LedgerRequest", "version"): MODEL_VERSION_MAX_LENGTH,
    ("ledger", "LedgerRequest", "variant"): VARIANT_MAX_LENGTH,
    ("ledger", "LedgerBatch", "model"): MODEL_NAME_MAX_LENGTH,
    ("ledger", "LedgerBatch", "version"): MODEL_VERSION_MAX_LENGTH,
    ("ledger", "LedgerBatch", "variant"): VARIANT_MAX_LENGTH,
    ("jobs", "Job", "model"): MODEL_NAME_MAX_LENGTH,
    ("jobs", "Job", "version"): MODEL_VERSION_MAX_LENGTH,
    ("carbon", "InstrumentCertificate", "certificate_id"): CERTIFICATE_ID_MAX_LENGTH,
    ("carbon", "InstrumentCertificate", "energy_source"): ENERGY_SOURCE_MAX_LENGTH,
    ("reports", "ReportingProfile", "responsible_person"): RESPONSIBLE_PERSON_MAX_LENGTH,
}

# Request and tensor parameters are stored nowhere, but each one is kept with its request while it waits.
PARAMETER_STRING_MAX_LENGTH: Final = 4096

TENSOR_MAX_DIMS: Final = 32
# The product of a shape's dimensions, zeros counted as one: far above any body the gateway accepts, far
# below the 2**63 bytes an array can address, whatever the datatype's size.
TENSOR_MAX_ELEMENTS: Final = 2**48
