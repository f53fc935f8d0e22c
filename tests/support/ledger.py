"""Spool lines in the recorder's format, for ledger tests that need no gateway."""

from __future__ import annotations

import itertools

import orjson

_ids = itertools.count(1)


def batch_energy_record(
    batch_id: str, interval_id: str, request_ids: list[str], shares_uj: list[int], final: bool = True
) -> dict[str, object]:
    """A batch's energy row for one interval, split over its requests, as the recorder spools it."""
    return {
        "k": "batch_energy",
        "batch_id": batch_id,
        "interval_id": interval_id,
        "energy_uj": sum(shares_uj),
        "request_ids": request_ids,
        "shares_uj": shares_uj,
        "final": final,
    }


def lines_for_batch(
    organization_id: int | None,
    requests: int = 3,
    energy_uj: int = 1_000_000,
    idle_uj: int = 100_000,
    device_id: str = "cpu-model",
    prefix: str = "t",
    per_request_energy: bool = False,
) -> tuple[list[bytes], list[str]]:
    """One batch, its requests, one interval with its idle line, and the batch's energy row with its split
    (with ``per_request_energy``, one part per request instead, as records written before batch rows)."""
    n = next(_ids)
    batch_id, interval_id = f"{prefix}.b{n}", f"{prefix}.i{n}"
    t0 = 1_800_000_000_000_000_000 + n * 1_000_000_000
    request_ids = [f"{prefix}.r{n}.{i}" for i in range(requests)]
    shares = [(energy_uj - idle_uj) // requests] * requests
    shares[0] += (energy_uj - idle_uj) - sum(shares)
    records: list[dict[str, object]] = [
        {
            "k": "device",
            "device_id": device_id,
            "kind": "cpu",
            "method": "modelled",
            "relative_uncertainty": 0.3,
        },
        {
            "k": "batch",
            "batch_id": batch_id,
            "model": "linear",
            "version": "1",
            "device_id": device_id,
            "instance": 0,
            "start_ns": t0 + 10,
            "end_ns": t0 + 2_000_010,
            "requests": requests,
            "rows": requests,
            "status": "ok",
        },
    ]
    for rid in request_ids:
        records.append(
            {
                "k": "req",
                "request_id": rid,
                "client_request_id": "",
                "organization_id": organization_id,
                "api_key_id": None,
                "model": "linear",
                "version": "1",
                "batch_id": batch_id,
                "device_id": device_id,
                "received_ns": t0,
                "started_ns": t0 + 10,
                "finished_ns": t0 + 2_000_010,
                "queue_ns": 10,
                "compute_ns": 2_000_000,
                "work_units": 256,
                "status": "ok",
            }
        )
    records.append(
        {
            "k": "interval",
            "interval_id": interval_id,
            "device_id": device_id,
            "method": "modelled",
            "relative_uncertainty": 0.3,
            "t0_ns": t0,
            "t1_ns": t0 + 1_000_000_000,
            "counter_start_j": n * 10.0,
            "counter_end_j": n * 10.0 + energy_uj / 1e6,
            "energy_uj": energy_uj,
            "idle_uj": idle_uj,
            "busy_ns": 2_000_000,
            "idle_ns": 998_000_000,
        }
    )
    records.append(
        {
            "k": "idle",
            "interval_id": interval_id,
            "device_id": device_id,
            "t0_ns": t0,
            "t1_ns": t0 + 1_000_000_000,
            "energy_uj": idle_uj,
            "idle_ns": 998_000_000,
            "idle_power_w": 0.1,
        }
    )
    if per_request_energy:
        for rid, share in zip(request_ids, shares, strict=True):
            records.append(
                {
                    "k": "energy",
                    "request_id": rid,
                    "interval_id": interval_id,
                    "batch_id": batch_id,
                    "energy_uj": share,
                    "final": True,
                }
            )
    else:
        records.append(batch_energy_record(batch_id, interval_id, request_ids, shares))
    return [orjson.dumps(r) + b"\n" for r in records], request_ids


def one_request_records(
    prefix: str,
    n: int,
    organization_id: int | None,
    device_id: str,
    t_ns: int,
    energy_uj: int,
    model: str = "digits",
) -> list[dict[str, object]]:
    """One batch holding one request, and the batch's whole (final) energy row, starting at ``t_ns``:
    spool-shaped records for ``append_records``. Ids are ``{prefix}.b{n}``, ``.r{n}`` and ``.i{n}``."""
    batch_id, request_id = f"{prefix}.b{n}", f"{prefix}.r{n}"
    return [
        {
            "k": "batch",
            "batch_id": batch_id,
            "model": model,
            "version": "1",
            "device_id": device_id,
            "instance": 0,
            "start_ns": t_ns,
            "end_ns": t_ns + 1000,
            "requests": 1,
            "rows": 1,
        },
        {
            "k": "req",
            "request_id": request_id,
            "organization_id": organization_id,
            "model": model,
            "version": "1",
            "batch_id": batch_id,
            "device_id": device_id,
            "received_ns": t_ns,
            "started_ns": t_ns,
            "finished_ns": t_ns + 1000,
            "queue_ns": 0,
            "compute_ns": 1000,
            "work_units": 4,
        },
        batch_energy_record(batch_id, f"{prefix}.i{n}", [request_id], [energy_uj]),
    ]
