"""Inside a rank of ``numarun check``: the GPU it sees, and pinned copy bandwidth to and from it.

:func:`seen_gpu` names the device a rank uses (entry ``index`` of ``CUDA_VISIBLE_DEVICES``, or
``index`` itself) and asks NVML about it (:func:`numarun.machine.nvml.visible_device`: PCI
address, name, UUID, ideal CPUs and memory nodes). :func:`load_torch_cuda` imports torch only
when it is installed, and says why the GPU part cannot run otherwise. :class:`PinnedCopies` times
host-to-device and device-to-host copies from a host buffer placed on a chosen NUMA node
(``mbind``, then ``cudaHostRegister``: page-locked where it lies, so the DMA reads that node).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from typing import Any

from numarun.check.memory import Buffer


def visible_entry(index: int, environ: Mapping[str, str]) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` entry CUDA's device ``index`` stands for: ``str(index)``
    when the variable is unset, None when the list is shorter (the device does not exist)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    entries = [entry.strip() for entry in visible.split(",")]
    return entries[index] if 0 <= index < len(entries) and entries[index] else None


def seen_gpu(index: int, environ: Mapping[str, str]) -> dict[str, Any]:
    """What this rank can learn of its GPU without CUDA: ``index``, ``visible_entry``, and from
    NVML (``source: "nvml"``, or None without it) ``pci_address``, ``name``, ``uuid``,
    ``nvml_cpus``, ``nvml_mems``."""
    entry = visible_entry(index, environ)
    seen: dict[str, Any] = {
        "index": index,
        "visible_entry": entry,
        "source": None,
        "pci_address": None,
        "name": None,
        "uuid": None,
        "nvml_cpus": None,
        "nvml_mems": None,
    }
    if entry is None:
        return seen
    from numarun.machine.nvml import visible_device

    facts = visible_device(entry)
    if facts is not None:
        seen.update(
            source="nvml",
            pci_address=facts["pci_address"],
            name=facts["name"],
            uuid=facts["uuid"],
            nvml_cpus=list(facts["cpus"]) if facts["cpus"] is not None else None,
            nvml_mems=list(facts["mems"]) if facts["mems"] is not None else None,
        )
    return seen


def load_torch_cuda() -> tuple[Any, str | None]:
    """``(torch, None)`` when torch is installed and sees a CUDA device; ``(None, why not)``
    otherwise. torch is imported only when its package is found."""
    import importlib.util
    import sys

    # Already imported (by a sitecustomize, say): find_spec would look at its __spec__.
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None, "torch is not installed"
    try:
        import torch  # type: ignore[import-not-found]
    except Exception as error:  # a broken install: say so, measure the rest
        return None, f"torch cannot be imported ({type(error).__name__}: {error})"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device (CPU-only build, or no driver)"
    return torch, None


class PinnedCopies:
    """Timed copies between one device buffer of ``size`` bytes on CUDA device ``index`` and
    page-locked host buffers placed on chosen NUMA nodes.

    Makes the device current (``torch.cuda.set_device``) and allocates the device buffer at
    construction. :meth:`close` frees everything it made; host buffers are unregistered
    (``cudaHostUnregister``) before they are unmapped.
    """

    def __init__(self, torch: Any, index: int, size: int) -> None:
        self.torch = torch
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        self.size = size
        self.on_device = torch.empty(size, dtype=torch.uint8, device=self.device)
        self._hosts: dict[int, tuple[Buffer, Any]] = {}

    def describe(self) -> dict[str, Any]:
        """The device as CUDA numbers it: ``name``, ``uuid``, ``pci_address`` (None where this
        torch's device properties lack the field)."""
        props = self.torch.cuda.get_device_properties(self.device)
        address = None
        if all(hasattr(props, f) for f in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            address = (
                f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            )
        uuid = getattr(props, "uuid", None)
        return {
            "name": props.name,
            "uuid": None if uuid is None else f"GPU-{uuid}",
            "pci_address": address,
        }

    def host_buffer(self, node: int) -> Any:
        """A page-locked host tensor of ``size`` bytes whose pages are on ``node`` (one per node,
        made at the first call). Raises :class:`OSError` when the node cannot be bound,
        :class:`RuntimeError` when CUDA refuses to register the pages."""
        if node in self._hosts:
            return self._hosts[node][1]
        buffer = Buffer(self.size, node)
        try:
            buffer.touch()
            status = int(self.torch.cuda.cudart().cudaHostRegister(buffer.address, buffer.size, 0))
            if status != 0:
                raise RuntimeError(f"cudaHostRegister failed with CUDA error {status}")
        except BaseException:
            buffer.close()
            raise
        array = (ctypes.c_ubyte * buffer.size).from_address(buffer.address)
        tensor = self.torch.frombuffer(array, dtype=self.torch.uint8)
        self._hosts[node] = (buffer, tensor)
        return tensor

    def rate(self, host: Any, direction: str, seconds: float) -> float:
        """Copy ``host`` to the device (``"h2d"``) or back (``"d2h"``) for about ``seconds``, at
        least once; GB/s (10^9 bytes per second, each byte counted once)."""
        torch = self.torch
        torch.cuda.synchronize(self.device)
        copies = 0
        began = time.perf_counter()
        while True:
            if direction == "h2d":
                self.on_device.copy_(host, non_blocking=True)
            else:
                host.copy_(self.on_device, non_blocking=True)
            torch.cuda.synchronize(self.device)
            copies += 1
            elapsed = time.perf_counter() - began
            if elapsed >= seconds:
                break
        return copies * self.size / elapsed / 1e9

    def close(self) -> None:
        for buffer, _tensor in self._hosts.values():
            try:
                self.torch.cuda.cudart().cudaHostUnregister(buffer.address)
            finally:
                buffer.close()
        self._hosts.clear()
        self.on_device = None
