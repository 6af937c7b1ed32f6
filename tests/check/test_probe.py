"""numarun.check.probe: what each rank runs under ``numarun check``: its CPUs read in its first
statement, torch never imported without a GPU part, one line when the GPU part cannot run,
refused outside a check; the copy phases with a stand-in for torch (no GPU here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from check_runs import CPUS
from numarun.check import command

# --- the probe itself ---------------------------------------------------------------------------


def test_the_probe_reads_its_cpus_in_its_first_statement() -> None:
    import ast

    source = Path(command.__file__).with_name("probe.py").read_text()
    body = ast.parse(source).body
    assert isinstance(body[0], ast.Expr)  # the docstring
    assert ast.unparse(body[1]) == "import os"
    assert ast.unparse(body[2]) == "CPUS_AT_START = sorted(os.sched_getaffinity(0))"


def probe_in_subprocess(
    tmp_path: Path, instructions: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    (tmp_path / "check.json").write_text(json.dumps(instructions))
    code = (
        "import sys\n"
        "from numarun.check import probe\n"
        "status = probe.main()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))\n"
        "sys.exit(status)\n"
    )
    env = {**os.environ, "NUMARUN_CHECK_DIR": str(tmp_path), "LOCAL_RANK": "0", "RANK": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "rank0.json").read_text())
    return result, json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


def instructions_for(phases: list[str], gpu: int | None) -> dict[str, Any]:
    return {
        "nprocs": 1,
        "phases": phases,
        "phase_seconds": 0.05,
        "buffer_bytes": 1 << 20,
        "barrier_timeout": 10,
        "far_of": {"0": None},
        "ranks": [{"home": None, "gpu": gpu}],
    }


def test_the_probe_never_imports_torch_without_a_gpu_part(tmp_path: Path) -> None:
    result, heavy = probe_in_subprocess(tmp_path, instructions_for(["memory-local"], None))
    assert heavy == []
    assert result["cpus"] == CPUS and result["home"] == 0
    assert result["memory_gbs"]["local"]["gbs"] > 0


@pytest.mark.slow
def test_the_gpu_part_says_why_it_cannot_run(tmp_path: Path) -> None:
    result, _ = probe_in_subprocess(
        tmp_path, instructions_for(["memory-local", "h2d-planned", "d2h-planned"], 0)
    )
    reasons = [line for line in result["not_measured"] if line.startswith("H2D/D2H")]
    assert len(reasons) == 1
    if shutil.which("nvidia-smi") is None:
        assert "CUDA" in reasons[0] or "torch" in reasons[0]
    assert result["gpu"]["index"] == 0 and result["h2d_gbs"] == {}


def test_the_probe_refuses_to_run_outside_a_check() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMARUN_CHECK_DIR", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-m", "numarun.check.probe"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "numarun check" in done.stderr


# --- the copy phases, with a stand-in for torch (no GPU here) -------------------------------------


class FakeTensor:
    def __init__(self, data: memoryview) -> None:
        self.data = data

    def copy_(self, other: FakeTensor, non_blocking: bool = False) -> None:
        self.data[:] = other.data


def fake_torch(registered: list[tuple[int, int]], unregistered: list[int]) -> Any:
    """What :class:`numarun.check.gpu.PinnedCopies` uses of torch, on the CPU: copies are
    memoryview copies, registrations are recorded."""
    import types

    def register(address: int, size: int, flags: int) -> int:
        registered.append((address, size))
        return 0

    def unregister(address: int) -> int:
        unregistered.append(address)
        return 0

    cudart = types.SimpleNamespace(cudaHostRegister=register, cudaHostUnregister=unregister)
    props = types.SimpleNamespace(
        name="Fake H100", uuid="1234-5678", pci_domain_id=0, pci_bus_id=0x18, pci_device_id=0
    )
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        set_device=lambda device: None,
        synchronize=lambda device=None: None,
        get_device_properties=lambda device: props,
        cudart=lambda: cudart,
    )
    module = types.ModuleType("torch")
    module.cuda = cuda  # type: ignore[attr-defined]
    module.uint8 = "uint8"  # type: ignore[attr-defined]
    module.device = lambda kind, index: (kind, index)  # type: ignore[attr-defined]
    module.empty = lambda size, dtype, device: FakeTensor(memoryview(bytearray(size)))  # type: ignore[attr-defined]
    module.frombuffer = lambda array, dtype: FakeTensor(memoryview(array).cast("B"))  # type: ignore[attr-defined]
    return module


def test_pinned_copies_place_register_copy_and_release(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.check.gpu import PinnedCopies

    registered: list[tuple[int, int]] = []
    unregistered: list[int] = []
    copies = PinnedCopies(fake_torch(registered, unregistered), 0, 1 << 20)
    host = copies.host_buffer(0)
    assert copies.host_buffer(0) is host  # one buffer per node
    assert registered == [(copies._hosts[0][0].address, 1 << 20)]
    assert copies._hosts[0][0].page_nodes()[0] == {0: 256}
    assert copies.rate(host, "h2d", 0.01) > 0
    assert bytes(copies.on_device.data[:4]) == b"\x01\x01\x01\x01"  # the touched host bytes
    assert copies.rate(host, "d2h", 0.01) > 0
    assert copies.describe() == {
        "name": "Fake H100", "uuid": "GPU-1234-5678", "pci_address": "0000:18:00.0",
    }  # fmt: skip
    copies.close()
    assert unregistered == [registered[0][0]]


def test_the_probe_runs_the_copy_phases_when_torch_has_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numarun.check import probe

    monkeypatch.setitem(sys.modules, "torch", fake_torch([], []))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    instructions = instructions_for(
        ["memory-local", "h2d-planned", "h2d-far", "d2h-planned", "d2h-far"], 0
    )
    run = probe.Probe(str(tmp_path), 0, instructions, {"LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"})
    run.read_binding()
    run.measure()
    result = run.result
    assert set(result["h2d_gbs"]) == {"planned"} and result["h2d_gbs"]["planned"]["node"] == 0
    assert set(result["d2h_gbs"]) == {"planned"}
    assert result["gpu"]["cuda"]["pci_address"] == "0000:18:00.0"
    far = [line for line in result["not_measured"] if "(far)" in line]
    assert far == [
        "H2D bandwidth (far): one NUMA node with CPUs and memory",
        "D2H bandwidth (far): one NUMA node with CPUs and memory",
    ]
    assert result["late_phases"] == []
