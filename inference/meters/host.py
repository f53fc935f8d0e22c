"""Device identity across hosts: the host id, and the device ids built from it.

A device id names one physical device in a database that several hosts share, so each id says where its
device is when the hardware gives no global name:

* a GPU: its UUID (``GPU-...``), global already (NVML and Triton report the same one);
* a RAPL package: ``rapl:<host id>:intel-rapl:<N>``;
* the modelled CPU of one gateway: ``cpu-model:<host id>:<instance>``, the instance naming the gateway (its
  ledger chain, which one live process holds at a time), so two gateways on one host never share one.

The host id is ``/etc/machine-id`` (or ``/var/lib/dbus/machine-id``), else the host name; a deployment may name
it (``CARBONLEDGER_HOST_ID``, checked by :func:`check_host_id`). In a container the machine id is the image's
(or missing) and the host name is the pod's, so there the host id should name the node: two pods on one node
share its RAPL packages.

Framework-free: no Django, no settings.
"""

from __future__ import annotations

import hashlib
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

HOST_ID_MAX: Final = 64
INSTANCE_MAX: Final = 32
MACHINE_ID_FILES: Final[tuple[Path, ...]] = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MACHINE_ID = re.compile(r"^[0-9a-f]{32}$")


def check_host_id(value: str) -> str:
    """``value`` when it can be part of a device id: 1 to 64 letters, digits, ``.``, ``_`` or ``-``, starting
    with a letter or digit. Raises ValueError saying what is wrong."""
    if not value or len(value) > HOST_ID_MAX or not _PART.match(value):
        raise ValueError(
            f"a host id must be 1 to {HOST_ID_MAX} letters, digits, '.', '_' or '-', starting with a letter or "
            f"a digit; got {value[:80]!r}"
        )
    return value


def _part(value: str, max_len: int) -> str:
    """``value`` as a device id part: itself when it is a valid one within ``max_len``, else a digest of it (a
    long or odd host name still names one host, consistently)."""
    if value and len(value) <= max_len and _PART.match(value):
        return value
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:max_len]


def detect_host_id(
    *,
    machine_id_files: Sequence[Path] = MACHINE_ID_FILES,
    hostname: Callable[[], str] = socket.gethostname,
) -> tuple[str, str]:
    """``(host id, where it came from)``: the machine id when one of ``machine_id_files`` holds one, else the
    host name (a digest of it when it is too long or has other characters)."""
    for path in machine_id_files:
        try:
            text = path.read_text(encoding="ascii").strip().lower()
        except (OSError, UnicodeDecodeError):
            continue
        if _MACHINE_ID.match(text):
            return text, str(path)
    name = hostname().strip().lower()
    return _part(name or "localhost", HOST_ID_MAX), "the host name"


def host_id(override: str | None = None) -> str:
    """The host id: ``override`` (checked) when given, else :func:`detect_host_id`'s."""
    if override:
        return check_host_id(override)
    return detect_host_id()[0]


def instance_part(instance: str) -> str:
    """A gateway's instance name (its ledger chain id) as a device id part, at most 32 characters."""
    return _part(instance, INSTANCE_MAX)


def rapl_device_id(host: str, zone: str) -> str:
    return f"rapl:{host}:{zone}"


def cpu_model_device_id(host: str, instance: str) -> str:
    return f"cpu-model:{host}:{instance_part(instance)}"
