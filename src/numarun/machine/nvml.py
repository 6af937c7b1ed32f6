"""Optional GPU names and UUIDs from NVML (the ``pynvml`` module of ``nvidia-ml-py``).

Only the NVIDIA management library is touched: never the CUDA runtime, never torch, so reading
the topology cannot create a CUDA context in the launcher. Everything here is best effort:
without ``pynvml`` or a driver, GPUs come back unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from numarun.machine.model import Gpu

logger = logging.getLogger(__name__)


def enrich(gpus: Sequence[Gpu]) -> tuple[Gpu, ...]:
    """``gpus`` with ``name`` and ``uuid`` filled in from NVML, matched by PCI address.

    Returns the GPUs unchanged (logging the reason at debug level) when ``pynvml`` cannot be
    imported, ``nvmlInit`` fails, or any NVML call raises; GPUs NVML does not list keep their
    fields. ``nvmlShutdown`` is called whenever ``nvmlInit`` succeeded. Must only be used for
    the real machine (root ``/``): NVML describes this host, not a snapshot.
    """
    gpus = tuple(gpus)
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        logger.debug("NVML enrichment skipped: pynvml (nvidia-ml-py) is not installed")
        return gpus
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        logger.debug("NVML enrichment skipped: nvmlInit failed: %s", exc)
        return gpus
    try:
        found = _names_by_address(pynvml)
    except Exception as exc:
        logger.debug("NVML enrichment skipped: %s", exc)
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            logger.debug("nvmlShutdown failed: %s", exc)
    return tuple(
        replace(g, name=found[g.pci_address][0], uuid=found[g.pci_address][1])
        if g.pci_address in found
        else g
        for g in gpus
    )


def _names_by_address(pynvml: Any) -> dict[str, tuple[str, str]]:
    """PCI address (sysfs spelling) -> (name, uuid) for every device NVML lists."""
    found: dict[str, tuple[str, str]] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        address = normalise_bus_id(bus_id)
        found[address] = (
            _text(pynvml.nvmlDeviceGetName(handle)),
            _text(pynvml.nvmlDeviceGetUUID(handle)),
        )
    return found


def normalise_bus_id(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as sysfs writes it: "0000:18:00.0" (lower case).

    A bus id that does not have the domain:bus:device.function shape is returned lower-cased.
    """
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else str(value)
