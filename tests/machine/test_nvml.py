"""numarun.machine.nvml: GPUs enriched from NVML (UUIDs, names) with a stand-in for pynvml; NVML
failures leave the GPUs as sysfs gave them, and NVML is never asked about another root."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from numarun.machine import nvml, topology
from numarun.machine.model import Gpu, Topology
from numarun.machine.topology import read_topology


def read(root: Path, **env: str) -> Topology:
    return read_topology(root, environ=env)


def addresses(gpus: tuple[Gpu, ...]) -> list[str]:
    return [g.pci_address for g in gpus]


# --- NVML ----------------------------------------------------------------------------------------


def fake_pynvml(
    devices: list[tuple[str | bytes, str, str]], *, fail_init: bool = False
) -> types.ModuleType:
    """A pynvml stand-in: devices are (busId, name, uuid); records calls in ``module.calls``."""
    module = types.ModuleType("pynvml")
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def handle(i: int) -> int:
        calls.append(f"handle{i}")
        if i >= len(devices):
            raise RuntimeError("Invalid Argument")
        return i

    module.calls = calls  # type: ignore[attr-defined]
    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    module.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=devices[h][0])  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: devices[h][1]  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: devices[h][2]  # type: ignore[attr-defined]
    return module


def two_gpus() -> list[Gpu]:
    return [
        Gpu(0, 0, "0000:18:00.0", "nvidia", 0, (0,)),
        Gpu(1, 1, "0000:9a:00.0", "nvidia", 1, (1,)),
    ]


def test_nvml_enrich(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_pynvml(
        [
            (b"00000000:9A:00.0", "NVIDIA H100 80GB HBM3", "GPU-bbbb"),
            ("00000000:18:00.0", "NVIDIA H100 80GB HBM3", "GPU-aaaa"),
        ]
    )
    monkeypatch.setitem(sys.modules, "pynvml", module)
    enriched = nvml.enrich(two_gpus())
    assert [(g.name, g.uuid) for g in enriched] == [
        ("NVIDIA H100 80GB HBM3", "GPU-aaaa"),
        ("NVIDIA H100 80GB HBM3", "GPU-bbbb"),
    ]
    assert module.calls[0] == "init" and module.calls[-1] == "shutdown"  # type: ignore[attr-defined]


def test_nvml_failures_leave_gpus_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert nvml.enrich(two_gpus()) == tuple(two_gpus())
    broken = fake_pynvml([], fail_init=True)
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert nvml.enrich(two_gpus()) == tuple(two_gpus())
    assert broken.calls == ["init"]  # type: ignore[attr-defined]
    midway = fake_pynvml([("0000:18:00.0", "x", "GPU-x")])
    midway.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", midway)
    assert nvml.enrich(two_gpus()) == tuple(two_gpus())
    assert midway.calls[-1] == "shutdown"  # type: ignore[attr-defined]


def test_normalise_bus_id() -> None:
    assert nvml.normalise_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert nvml.normalise_bus_id("00000009:01:00.0") == "0009:01:00.0"
    assert nvml.normalise_bus_id("garbage") == "garbage"


def test_nvml_never_called_for_another_root(
    tree: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = fake_pynvml([("00000000:18:00.0", "H100", "GPU-aaaa")])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    topo = read(tree("dgx_h100"))
    assert module.calls == []  # type: ignore[attr-defined]
    assert all(g.uuid is None for g in topo.gpus)


def test_host_root_uses_nvml_for_uuids(
    tree: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pretend the DGX tree is "/" to check UUIDs reach CUDA_VISIBLE_DEVICES resolution."""
    root = tree("dgx_h100")
    module = fake_pynvml(
        [("00000000:9A:00.0", "H100", "GPU-9a9a"), ("00000000:18:00.0", "H100", "GPU-1818")]
    )
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(topology, "_is_host_root", lambda r: True)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(224)))
    topo = read(root, CUDA_VISIBLE_DEVICES="GPU-9a,GPU-18,3")
    assert addresses(topo.gpus) == ["0000:9a:00.0", "0000:18:00.0", "0000:5d:00.0"]
    assert [g.uuid for g in topo.gpus] == ["GPU-9a9a", "GPU-1818", None]
    assert topo.gpus[0].name == "H100"
