"""numarun.check.gpu: NVML's view of the rank's GPU (its name, ideal CPUs and nodes), with a
stand-in for pynvml; without pynvml the GPU is only its index."""

from __future__ import annotations

import sys
from typing import Any

import pytest

# --- NVML's view of the rank's GPU ---------------------------------------------------------------


def fake_nvml(devices: list[dict[str, Any]], *, memory_affinity: bool = True) -> Any:
    """A pynvml stand-in: each device a dict of busId, name, uuid, cpu_words, node_words."""
    import types

    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: devices[i]  # type: ignore[attr-defined]
    module.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h["busId"])  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: h["name"]  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: h["uuid"]  # type: ignore[attr-defined]

    def cpu_affinity(handle: dict[str, Any], words: int) -> list[int]:
        return (handle["cpu_words"] + [0] * words)[:words]

    def memory_affinity_of(handle: dict[str, Any], words: int, scope: int) -> list[int]:
        if not memory_affinity:
            raise RuntimeError("Function Not Found")
        assert scope == 0  # NVML_AFFINITY_SCOPE_NODE
        return (handle["node_words"] + [0] * words)[:words]

    module.nvmlDeviceGetCpuAffinity = cpu_affinity  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryAffinity = memory_affinity_of  # type: ignore[attr-defined]
    return module


H100S = [
    {"busId": "00000000:18:00.0", "name": "NVIDIA H100", "uuid": "GPU-aaaa-1111",
     "cpu_words": [0xFF, 0x1], "node_words": [0x1]},
    {"busId": b"00000000:9A:00.0", "name": b"NVIDIA H100", "uuid": b"GPU-bbbb-2222",
     "cpu_words": [0xFF00], "node_words": [0x2]},
]  # fmt: skip


def test_nvml_names_the_gpu_and_its_ideal_cpus_and_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.check.gpu import seen_gpu
    from numarun.machine import nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(H100S))
    first = nvml.visible_device("0", cpu_count=128)
    assert first == {
        "pci_address": "0000:18:00.0", "name": "NVIDIA H100", "uuid": "GPU-aaaa-1111",
        "cpus": (*range(8), 64), "mems": (0,),
    }  # fmt: skip
    by_uuid = nvml.visible_device("GPU-bbbb", cpu_count=64)
    assert by_uuid is not None and by_uuid["pci_address"] == "0000:9a:00.0"
    assert by_uuid["cpus"] == tuple(range(8, 16)) and by_uuid["mems"] == (1,)
    assert nvml.visible_device("GPU-", cpu_count=64) is None  # ambiguous prefix
    assert nvml.visible_device("7") is None
    # The rank's device is entry LOCAL_RANK of CUDA_VISIBLE_DEVICES.
    seen = seen_gpu(0, {"CUDA_VISIBLE_DEVICES": "1,0"})
    assert seen["visible_entry"] == "1" and seen["pci_address"] == "0000:9a:00.0"
    assert seen["source"] == "nvml" and seen["nvml_cpus"] == list(range(8, 16))
    assert seen_gpu(2, {"CUDA_VISIBLE_DEVICES": "1,0"})["source"] is None


def test_nvml_without_memory_affinity_still_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.machine import nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(H100S, memory_affinity=False))
    facts = nvml.visible_device("1", cpu_count=64)
    assert facts is not None and facts["mems"] is None and facts["uuid"] == "GPU-bbbb-2222"


def test_without_pynvml_the_gpu_is_only_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.check.gpu import seen_gpu

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    seen = seen_gpu(0, {})
    assert seen["visible_entry"] == "0" and seen["source"] is None and seen["pci_address"] is None
