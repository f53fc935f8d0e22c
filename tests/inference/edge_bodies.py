"""Hypothesis strategies for infer request bodies a client might send (issue 22's fuzzing).

Each body starts as a well-formed request for one of the edge gateway's models (``linear``: x FP32 [-1, 256];
``echo_bytes``: text BYTES [-1, -1]), JSON or binary extension, and then has up to three of its fields
corrupted: swapped for a JSON value of another type, shapes huge or negative, values their datatype cannot
hold, sizes that lie (binary_data_size, Inference-Header-Content-Length, the binary data itself). Few
corruptions at a time, so that most bodies get past the first check and exercise the later ones.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from inference.kserve import DTYPES, LITTLE_ENDIAN

DATATYPES = sorted(DTYPES)
MAX_BUILT_ELEMENTS = 1024  # larger shapes get no matching data: the request is refused anyway

EXTREME_INTS = [0, 1, 255, 256, 300, 2**31, 10**8, 10**15, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**80]
EXTREME_FLOATS = [
    -0.0,
    5e-324,
    1e-50,
    65504.0,
    65520.0,
    3.4028235e38,
    3.40282357e38,
    3.4e39,
    -3.4e39,
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
ID_CHARS = st.characters(exclude_characters="\x00")
dims = st.one_of(st.integers(-2, 4), st.sampled_from(EXTREME_INTS), st.sampled_from([-1, -(2**63)]))

# Fields a body may have corrupted; every other field stays well-formed.
FIELDS = (
    "id",
    "parameters",
    "inputs",
    "name",
    "datatype",
    "shape",
    "data",
    "values",
    "tensor_parameters",
    "binary_data_size",
    "blob",
    "outputs",
    "header_length",
    "extra_input",
)


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
def _tensor(draw: st.DrawFn, model: str, binary: bool, bad: frozenset[str]) -> tuple[dict[str, Any], bytes]:
    """One input tensor and its binary data (empty for JSON)."""
    name, datatype = ("x", "FP32") if model == "linear" else ("text", "BYTES")
    tensor: dict[str, Any] = {
        "name": draw(json_values | st.sampled_from(["y", "", "x" * 300])) if "name" in bad else name,
        "datatype": draw(json_values | st.sampled_from(DATATYPES)) if "datatype" in bad else datatype,
    }
    rows = draw(st.integers(1, 3))
    width = 256 if model == "linear" else draw(st.integers(0, 3))
    shape: Any = [rows, width]
    if "shape" in bad:
        shape = draw(json_values | st.lists(dims, max_size=4) | st.lists(dims, min_size=30, max_size=70))
    tensor["shape"] = shape
    datatype_now = (
        tensor["datatype"] if isinstance(tensor["datatype"], str) and tensor["datatype"] in DTYPES else "FP32"
    )
    count = _element_count(shape)
    if not binary:
        fill: Any = {"BYTES": "w", "BOOL": True}.get(datatype_now, 0.5)
        if "data" in bad or count is None:
            data: Any = draw(json_values)
        else:
            size = count + (draw(st.sampled_from([-1, 1])) if "values" in bad and draw(st.booleans()) else 0)
            size = max(size, 0)
            data = [fill] * size
            if size and "values" in bad:
                data[draw(st.integers(0, size - 1))] = draw(json_scalars)
            elif size and datatype_now == "FP32":
                data[-1] = draw(st.floats(width=32, allow_nan=False, allow_infinity=False))
            if len(shape) == 2 and shape[1] and size == count and draw(st.booleans()):
                data = [data[i : i + shape[1]] for i in range(0, count, shape[1])]  # nested rows
        tensor["data"] = data
        if "tensor_parameters" in bad:
            tensor["parameters"] = draw(
                json_values | st.fixed_dictionaries({"binary_data_size": json_values})
            )
        return tensor, b""
    if datatype_now == "BYTES" and count is not None:
        blob = _bytes_blob(draw(st.lists(st.binary(max_size=5), min_size=count, max_size=count)))
    elif count is not None:
        n = count * LITTLE_ENDIAN[datatype_now].itemsize
        blob = draw(st.binary(min_size=n, max_size=n)) if n <= 64 else bytes(n)
    else:
        blob = draw(st.binary(max_size=16))
    if "blob" in bad:
        blob = draw(
            st.sampled_from(
                [blob[:-1], blob + b"\x00", blob[4:], b"\xff\xff\xff\xff" + blob, b"\x02" * len(blob)]
            )
        )
    declared: Any = len(blob)
    if "binary_data_size" in bad:
        declared = draw(json_values | st.sampled_from([-1, 0, 2**64, len(blob) + 1, len(blob) - 1]))
    params: Any = {"binary_data_size": declared}
    if "tensor_parameters" in bad:
        params = draw(json_values | st.just({"binary_data_size": declared, "other": {"a": 1}}))
    tensor["parameters"] = params
    return tensor, blob


@st.composite
def infer_bodies(draw: st.DrawFn, json_only: bool = False) -> Body:
    model = draw(st.sampled_from(["linear", "echo_bytes"]))
    binary = False if json_only else draw(st.booleans())
    bad = frozenset(draw(st.sets(st.sampled_from(FIELDS), max_size=3)))
    doc: dict[str, Any] = {}
    if "id" in bad:
        doc["id"] = draw(
            json_values
            | st.text(min_size=250, max_size=300)
            | st.text(alphabet=st.sampled_from(["a", "\u0000", "\ud7ff", "é"]), max_size=6)
        )
    elif draw(st.booleans()):
        doc["id"] = draw(st.text(ID_CHARS, max_size=12) | st.text(ID_CHARS, min_size=256, max_size=256))
    if "parameters" in bad:
        doc["parameters"] = draw(
            json_values
            | st.dictionaries(
                st.sampled_from(["binary_data_output", "priority", "timeout", "custom"]),
                json_values,
                max_size=2,
            )
            | st.just({"custom": "v" * 5000})
        )
    elif draw(st.booleans()):
        doc["parameters"] = {"binary_data_output": draw(st.booleans()), "priority": draw(st.integers(0, 3))}
    tensors = [draw(_tensor(model, binary, bad))]
    if "extra_input" in bad:
        tensors.append(draw(_tensor(model, binary, bad)))
    doc["inputs"] = [t for t, _ in tensors]
    if "inputs" in bad:
        doc["inputs"] = draw(json_values)
    out_name = "y" if model == "linear" else "text"
    if "outputs" in bad:
        doc["outputs"] = draw(
            json_values
            | st.lists(
                st.fixed_dictionaries(
                    {"name": json_values | st.just(out_name)}, optional={"parameters": json_values}
                ),
                max_size=2,
            )
            | st.just([{"name": out_name, "parameters": {"binary_data": True, "classification": 2}}])
        )
    elif draw(st.booleans()):
        doc["outputs"] = [{"name": out_name, "parameters": {"binary_data": draw(st.booleans())}}]
    # json.dumps, not orjson: it writes integers beyond 64 bits, which a client may send.
    header = json.dumps(doc).encode()
    body = header + b"".join(blob for _, blob in tensors)
    header_length: str | None = str(len(header)) if binary else None
    if "header_length" in bad:
        header_length = draw(
            st.none()
            | st.integers(-2, len(body) + 2).map(str)
            | st.sampled_from(["", "x", "1.5", "-0", "0x10", "99999999999999999999"])
        )
    return Body(model, body, header_length)
