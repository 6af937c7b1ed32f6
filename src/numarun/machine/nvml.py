"""Optional GPU facts from NVML (the ``pynvml`` module of ``nvidia-ml-py``).

:func:`enrich` adds names and UUIDs to the GPUs read from sysfs; :func:`visible_device` says
what NVML knows of the GPU a ``CUDA_VISIBLE_DEVICES`` entry names, its ideal CPUs and memory
nodes included (``nvmlDeviceGetCpuAffinity``, ``nvmlDeviceGetMemoryAffinity``), for
``numarun check``. Only the NVIDIA management library is touched: never the CUDA runtime,
never torch, so reading the topology cannot create a CUDA context in the launcher. Everything
here is best effort: without ``pynvml`` or a driver, GPUs come back unchanged and
:func:`visible_device` answers None.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
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
        g.replace(name=found[g.pci_address][0], uuid=found[g.pci_address][1])
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


# NVML_AFFINITY_SCOPE_NODE: the ideal CPUs / memory nodes within the GPU's NUMA node.
_AFFINITY_SCOPE_NODE = 0
_MASK_WORD_BITS = 64  # pynvml hands the masks back as arrays of unsigned long long


def visible_device(entry: str, *, cpu_count: int | None = None) -> dict[str, Any] | None:
    """What NVML says of the GPU a ``CUDA_VISIBLE_DEVICES`` entry names; None without NVML.

    ``entry`` is an index in PCI order (what CUDA numbers under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    which numarun's plan sets) or a ``GPU-`` UUID or unique prefix of one. The answer has
    ``pci_address`` (sysfs spelling), ``name``, ``uuid``, ``cpus`` (the device's ideal CPUs,
    ``nvmlDeviceGetCpuAffinity``: those of its NUMA node) and ``mems`` (its ideal memory nodes,
    ``nvmlDeviceGetMemoryAffinity`` at node scope); a fact NVML cannot give is None. Returns
    None when ``pynvml`` is missing, ``nvmlInit`` fails, or no device matches ``entry``.
    ``cpu_count`` sizes the CPU mask (default ``os.cpu_count()``). ``nvmlShutdown`` is called
    whenever ``nvmlInit`` succeeded.
    """
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        logger.debug("NVML unavailable: nvmlInit failed: %s", exc)
        return None
    try:
        handle = _handle_for(pynvml, entry.strip())
        if handle is None:
            return None
        return _facts(pynvml, handle, cpu_count)
    except Exception as exc:
        logger.debug("NVML could not describe device %r: %s", entry, exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            logger.debug("nvmlShutdown failed: %s", exc)


def _handle_for(pynvml: Any, entry: str) -> Any:
    if entry.isascii() and entry.isdigit():
        index = int(entry)
        if index >= pynvml.nvmlDeviceGetCount():
            return None
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    if not entry.upper().startswith("GPU-"):
        return None
    found = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        if _text(pynvml.nvmlDeviceGetUUID(handle)).lower().startswith(entry.lower()):
            found.append(handle)
    return found[0] if len(found) == 1 else None


def _facts(pynvml: Any, handle: Any, cpu_count: int | None) -> dict[str, Any]:
    import os

    facts: dict[str, Any] = {
        "pci_address": normalise_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId)),
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "cpus": None,
        "mems": None,
    }
    words = ((cpu_count or os.cpu_count() or 1) + _MASK_WORD_BITS - 1) // _MASK_WORD_BITS
    try:
        facts["cpus"] = mask_bits(pynvml.nvmlDeviceGetCpuAffinity(handle, words))
    except Exception as exc:  # NOT_SUPPORTED on some boards and in some containers
        logger.debug("nvmlDeviceGetCpuAffinity failed: %s", exc)
    try:
        nodes = pynvml.nvmlDeviceGetMemoryAffinity(handle, 16, _AFFINITY_SCOPE_NODE)
        facts["mems"] = mask_bits(nodes)
    except Exception as exc:  # older drivers and pynvml releases lack it
        logger.debug("nvmlDeviceGetMemoryAffinity failed: %s", exc)
    return facts


def mask_bits(words: Any) -> tuple[int, ...]:
    """The bit numbers set in an NVML mask (64 bits per word, word 0 first), ascending."""
    return tuple(
        index * _MASK_WORD_BITS + bit
        for index, word in enumerate(int(w) for w in words)
        if word
        for bit in range(_MASK_WORD_BITS)
        if word >> bit & 1
    )
