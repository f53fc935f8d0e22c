"""Hypothesis strategies for infer request bodies a client might send (issue 22's fuzzing): mostly well-formed
requests for the edge gateway's models (``linear``: x FP32 [-1, 256]; ``echo_bytes``: text BYTES [-1, -1]),
JSON or binary extension, with any field swapped for a value of the wrong type, shapes huge or negative,
values their datatype cannot hold, and lying sizes (binary_data_size, Inference-Header-Content-Length)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from inference.kserve import DTYPES, LITTLE_ENDIAN

DATATYPES = sorted(DTYPES)
MAX_BUILT_ELEMENTS = 1024  # larger shapes get no matching data: the request is refused or wild anyway

EXTREME_INTS = [
    0,
    1,
    2,
    255,
    256,
    300,
    2**31,
    10**8,
    10**15,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    2**80,
]
EXTREME_FLOATS = [
    0.5,
    -0.0,
    5e-324,
    1e-50,
    65504.0,
    65520.0,
    3.4028235e38,
    3.40282357e38,
    3.4e39,
    1.7976931348623157e308,
]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(EXTREME_INTS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(EXTREME_FLOATS),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` three times in four, any JSON value otherwise."""
    return st.one_of(valid, valid, valid, json_values)


dims = st.one_of(st.integers(-2, 4), st.sampled_from(EXTREME_INTS), st.sampled_from([-1, -(2**63)]))
request_ids = st.one_of(
    st.text(max_size=12),
    st.text(min_size=250, max_size=300),
    st.text(alphabet=st.sampled_from(["a", "\u0000", "\ud7ff", "é"]), max_size=6),
)
parameter_values = st.one_of(st.booleans(), st.integers(-5, 2**70), st.text(max_size=20), json_values)


@dataclass(frozen=True)
class Body:
    model: str
    body: bytes
    header_length: str | None  # the Inference-Header-Content-Length header, None when absent

    def header_bytes(self) -> bytes | None:
        return None if self.header_length is None else self.header_length.encode("latin-1")


def _element_count(shape: Any) -> int | None:
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        return None
    count = 1
    for d in shape:
        count *= d
    return count if 0 <= count <= MAX_BUILT_ELEMENTS else None


def _bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


@st.composite
def _tensor(draw: st.DrawFn, model: str, binary: bool) -> tuple[dict[str, Any], bytes]:
    """One input tensor and its binary data (empty for JSON)."""
    name, datatype, width = ("x", "FP32", 256) if model == "linear" else ("text", "BYTES", 1)
    tensor: dict[str, Any] = {
        "name": draw(mostly(st.sampled_from([name, "x", "text", ""]))),
        "datatype": draw(mostly(st.sampled_from([datatype, datatype, *DATATYPES]))),
    }
    shape = draw(mostly(st.one_of(st.integers(0, 3).map(lambda r: [r, width]), st.lists(dims, max_size=4))))
    tensor["shape"] = shape
    datatype_now = tensor["datatype"] if isinstance(tensor["datatype"], str) else "FP32"
    count = _element_count(shape)
    if not binary:
        if count is not None and draw(st.integers(0, 3)):
            fill: Any = "w" if datatype_now == "BYTES" else (True if datatype_now == "BOOL" else 0.5)
            special = draw(mostly(st.sampled_from([fill, *EXTREME_FLOATS, *EXTREME_INTS, True, "s"])))
            size = count + draw(st.sampled_from([0, 0, 0, -1, 1]))
            data: Any = [fill] * max(size - 1, 0) + ([special] if size > 0 else [])
            if count and len(shape) == 2 and shape[1] and size == count and draw(st.booleans()):
                data = [data[i : i + shape[1]] for i in range(0, count, shape[1])]  # nested rows
        else:
            data = draw(json_values)
        if draw(st.integers(0, 9)):
            tensor["data"] = data
        if not draw(st.integers(0, 9)):
            tensor["parameters"] = draw(json_values)
        return tensor, b""
    if datatype_now == "BYTES" and count is not None:
        blob = _bytes_blob(draw(st.lists(st.binary(max_size=5), min_size=count, max_size=count)))
    elif datatype_now in LITTLE_ENDIAN and count is not None:
        n = count * LITTLE_ENDIAN[datatype_now].itemsize
        blob = draw(st.binary(min_size=n, max_size=n)) if n <= 64 else bytes(n)
    else:
        blob = draw(st.binary(max_size=16))
    blob = draw(st.sampled_from([blob, blob, blob, blob[:-1], blob + b"\x00", blob[4:]]))
    size = draw(mostly(st.one_of(st.just(len(blob)), st.sampled_from([-1, 0, 2**64, len(blob) + 1]))))
    params = {"binary_data_size": size}
    if not draw(st.integers(0, 9)):
        params = draw(json_values)
    tensor["parameters"] = params
    return tensor, blob


@st.composite
def infer_bodies(draw: st.DrawFn, json_only: bool = False) -> Body:
    model = draw(st.sampled_from(["linear", "echo_bytes"]))
    binary = False if json_only else draw(st.booleans())
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["id"] = draw(mostly(request_ids))
    if not draw(st.integers(0, 3)):
        doc["parameters"] = draw(
            mostly(
                st.dictionaries(
                    st.sampled_from(["binary_data_output", "priority", "timeout", "custom"]),
                    parameter_values,
                    max_size=2,
                )
            )
        )
    tensors = [draw(_tensor(model, binary)) for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2])))]
    doc["inputs"] = draw(mostly(st.just([t for t, _ in tensors])))
    if not draw(st.integers(0, 3)):
        out_name = "y" if model == "linear" else "text"
        output = st.fixed_dictionaries(
            {"name": mostly(st.just(out_name))},
            optional={"parameters": mostly(st.fixed_dictionaries({"binary_data": mostly(st.booleans())}))},
        )
        doc["outputs"] = draw(mostly(st.lists(output, max_size=2)))
    # json.dumps, not orjson: it writes integers beyond 64 bits, which a client may send.
    header = json.dumps(doc).encode()
    body = header + b"".join(blob for _, blob in tensors)
    header_length: str | None = None
    if binary or not draw(st.integers(0, 9)):
        header_length = draw(
            st.one_of(
                st.just(str(len(header))),
                st.just(str(len(header))),
                st.integers(-2, len(body) + 2).map(str),
                st.sampled_from(["", "x", "1.5", "-0", "0x10", "99999999999999999999"]),
            )
        )
    return Body(model, body, header_length)
