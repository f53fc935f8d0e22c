"""A large legal body is decoded off the event loop: while its decoding runs (seconds of BYTES elements), the
gateway goes on answering small requests."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import orjson
import requests

from tests.inference.edge_gateway import good_linear_body, post, serve_edge_gateway

MiB = 1024 * 1024


def _slow_bytes_body(elements: int) -> tuple[bytes, int]:
    """A binary BYTES request whose every element is checked before a stray last byte refuses it (400): all
    the decoding work, and a short answer."""
    payload = (struct.pack("<I", 1) + b"a") * elements + b"!"
    header = orjson.dumps(
        {
            "id": "big",
            "inputs": [
                {
                    "name": "text",
                    "shape": [1, elements],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
        }
    )
    return header + payload, len(header)


def test_small_requests_are_answered_while_a_large_body_is_decoded(tmp_path: Path) -> None:
    body, header_length = _slow_bytes_body(6_000_000)
    with serve_edge_gateway(tmp_path / "models", max_body=32 * MiB) as (address, _spy):
        session = requests.Session()
        assert post(session, address, "linear", good_linear_body()).status_code == 200  # warm
        big: dict[str, float | int] = {}

        def send_big() -> None:
            started = time.monotonic()
            answer = post(requests.Session(), address, "echo_bytes", body, header_length)
            big["status"] = answer.status_code
            big["seconds"] = time.monotonic() - started

        sender = threading.Thread(target=send_big)
        sender.start()
        time.sleep(0.3)  # the body is in; its decoding has begun
        latencies = []
        while sender.is_alive() and len(latencies) < 20:
            started = time.monotonic()
            assert post(session, address, "linear", good_linear_body()).status_code == 200
            latencies.append(time.monotonic() - started)
        sender.join(60)
        assert big["status"] == 400
        assert big["seconds"] > 0.8, "the large body decoded too fast to show anything"
        assert latencies, "no small request was sent while the large body was decoded"
        # Waiting behind the decoding, a small request would take most of it; beside it, a fraction.
        assert max(latencies) < min(0.5, float(big["seconds"]) / 3), (latencies, big)
