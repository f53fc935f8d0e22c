"""Property-based fuzzing of job files (issue 22): whatever JSON Lines a client uploads, ``parse_job_file``
accepts it or refuses it with a ``JobInputError`` naming what is wrong (which the API and the dashboard turn
into a 400 and a message next to the form), promptly; nothing else escapes it. A fixed, small budget."""

from __future__ import annotations

import time
from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inference.config import ModelSpec, load_config
from jobs.inputs import JobInputError, parse_job_file
from tests.inference.edge_bodies import infer_bodies
from tests.jobs.conftest import DEMO_REPOSITORY, infer_line

BOUNDS = {"max_requests": 20, "max_file_bytes": 1_000_000, "max_body_bytes": 64 * 1024}
SPEC: ModelSpec = load_config(DEMO_REPOSITORY / "linear")


def _changed(tensor: dict[str, Any] | None = None, **top: Any) -> bytes:
    doc = orjson.loads(infer_line(0))
    doc["inputs"][0].update(tensor or {})
    doc.update(top)
    return orjson.dumps(doc)


# Lines the gateway refused with a 500 or let through into the ledger before issue 22.
FINDING_LINES = [
    _changed(id="r" * 257),
    _changed(id="a\u0000b"),
    _changed({"datatype": ["FP32"]}),
    _changed({"datatype": {"FP32": 1}}),
    _changed({"shape": [1, 2**62]}),
    _changed({"data": [0.5] * 255 + [3.4e39]}),
    _changed(parameters=[]),
]

job_lines = st.one_of(
    infer_bodies(json_only=True).map(lambda b: b.body),
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
)


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lines=st.lists(job_lines, min_size=0, max_size=4))
@example(lines=[infer_line(0), *FINDING_LINES])
@example(lines=[FINDING_LINES[0]])
@example(lines=[FINDING_LINES[1]])
@example(lines=[FINDING_LINES[2]])
@example(lines=[FINDING_LINES[3]])
@example(lines=[FINDING_LINES[4]])
@example(lines=[FINDING_LINES[5]])
@example(lines=[FINDING_LINES[6]])
def test_any_job_file_is_accepted_or_refused_by_line_promptly(lines: list[bytes]) -> None:
    data = b"\n".join(lines)
    started = time.perf_counter()
    try:
        parsed = parse_job_file(data, SPEC, **BOUNDS)
    except JobInputError as exc:
        assert str(exc)
    else:
        assert parsed and all(line.body for line in parsed)
        assert data not in FINDING_LINES, "a finding line was accepted"
    assert time.perf_counter() - started < 1.0
