"""One gateway meters a device: the policy when a device is metered by another live gateway, and the fence that
stops a meter booking energy once its claim is no longer surely this process's.

The claims themselves (database leases named ``device:<device id>``) are the wiring's; this module gets two
plain callables, so that it stays framework-free:

* ``claim(device_id)`` returns None when this process now holds the device, else who does (for the message);
* ``release(device_id)`` gives a claimed device up.

The policy (:func:`claim_devices`):

* **one gateway per GPU**: a GPU another live gateway meters stops this one's start-up with
  :class:`DeviceHeld`, naming the GPU and the holder (Kubernetes hands each GPU to one pod; two gateways on
  one GPU is a deployment error, and serving it unmetered would hide it);
* **a host's RAPL packages go to one gateway**: when any is taken, this gateway meters none of them and
  falls back to its own process's modelled CPU meter (method ``modelled``; its device info says why);
* a modelled CPU meter is this process's own device (host and instance): claimed like the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .base import ClockNs, Meter, MeterError, MeterMethod

Claim = Callable[[str], "str | None"]
Release = Callable[[str], None]


#: How the reason of a fallback meter starts.
FALLBACK = "cpu-model: this gateway falls back to its own modelled CPU (its own process)"


class DeviceHeld(MeterError):
    """A device this gateway must meter is metered by another live gateway."""

    def __init__(self, device_id: str, holder: str, message: str) -> None:
        self.device_id = device_id
        self.holder = holder
        super().__init__(message)


def is_gpu(meter: Meter) -> bool:
    return meter.method.startswith("nvml") or meter.method == "triton"


def lease_name(device_id: str) -> str:
    """The name of a device's lease."""
    return f"device:{device_id}"


def claim_devices(
    meters: list[tuple[Meter, str]],
    claim: Claim,
    release: Release,
    *,
    fallback: Callable[[], Meter],
) -> list[tuple[Meter, str]]:
    """The meters this gateway may use, each claimed, with why; see the module doc for the policy.

    ``meters`` are unstarted (as :func:`~inference.meters.registry.probe_meters` returns them); the ones
    given up are closed. ``fallback`` makes this process's modelled CPU meter. On :class:`DeviceHeld` every
    meter is closed and every claim made here released.
    """
    kept: list[tuple[Meter, str]] = []
    rapl: list[tuple[Meter, str]] = []
    taken: list[tuple[str, str]] = []  # (RAPL device id, holder)
    try:
        for meter, why in meters:
            holder = claim(meter.device_id)
            if holder is None:
                (rapl if meter.method == "rapl" else kept).append((meter, why))
                continue
            if meter.method == "rapl":
                taken.append((meter.device_id, holder))
                meter.close()
                continue
            if is_gpu(meter):
                raise DeviceHeld(
                    meter.device_id,
                    holder,
                    f"GPU {meter.device_id} is metered by the gateway {holder}: one gateway per GPU, so this "
                    "one refuses to start. Give each gateway its own GPUs (Kubernetes' device plugin does; "
                    "on one host, NVIDIA_VISIBLE_DEVICES), or stop the other gateway first",
                )
            raise DeviceHeld(
                meter.device_id,
                holder,
                f"device {meter.device_id} is metered by {holder}: it names this process's own device "
                "(host id and ledger chain), so another live process was started as this one",
            )
        if taken:
            for meter, _ in rapl:  # the host's packages go together: the holder of one meters the host
                release(meter.device_id)
                meter.close()
            rapl = []
            if not any(m.method == "modelled" for m, _ in kept):
                held = ", ".join(f"{device} (metered by {holder})" for device, holder in taken)
                cpu = fallback()
                if claim(cpu.device_id) is not None:
                    cpu.close()
                    raise DeviceHeld(
                        cpu.device_id, "", f"device {cpu.device_id} is metered by another process"
                    )
                kept.append((cpu, f"{FALLBACK}: the host's RAPL package {held} is another gateway's"))
    except BaseException:
        for meter, _ in [*kept, *rapl]:
            release(meter.device_id)
            meter.close()
        for meter, _ in meters:
            meter.close()
        raise
    return [*rapl, *kept]


class FencedMeter(Meter):
    """``inner``, booking energy only while ``live()`` says this process surely holds the device.

    ``live()`` is true from a claim or renewal of the device's lease until one lease time after that renewal
    began (before which nobody else can have claimed it). In between (the database unreachable), readings hold
    the last energy known to be this process's; a renewal that succeeds again (nobody took the lease) lets the
    held energy through at the next reading, so nothing is lost. Once the lease was taken over ``live()`` stays
    false: this meter books nothing more, and the device's energy is the new holder's alone. The inner meter
    is read all along (a RAPL counter must be read at least once per wrap).
    """

    def __init__(
        self, inner: Meter, live: Callable[[], bool], *, clock_ns: ClockNs = time.monotonic_ns
    ) -> None:
        self._inner = inner
        self._live = live
        self._reported_j = 0.0
        super().__init__(inner.device_id, clock_ns=clock_ns)

    @property
    def inner(self) -> Meter:
        return self._inner

    @property
    def method(self) -> MeterMethod:
        return self._inner.method

    @property
    def held(self) -> bool:
        return self._live()

    def device_info(self) -> dict[str, str]:
        return {**self._inner.device_info(), "lease": lease_name(self.device_id)}

    def _start(self) -> None:
        self._inner.start()
        self._reported_j = 0.0

    def _read(self) -> tuple[float, int]:
        reading = self._inner.read()
        # Checked after the reading: live now means nobody else can have claimed the device by then either.
        if self._live():
            self._reported_j = reading.energy_j
        return self._reported_j, reading.t_ns

    def _close(self, *, was_started: bool) -> None:
        self._inner.close()
