"""numarun.machine.snapshot: a machine's sysfs saved as an archive (``numarun snapshot``) reads
back as the same machine, for every fake shape and for this machine."""

from __future__ import annotations

import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from numarun.errors import TopologyError
from numarun.machine.model import Topology
from numarun.machine.snapshot import snapshot
from numarun.machine.topology import read_topology


def read(root: Path, **env: str) -> Topology:
    return read_topology(root, environ=env)


@pytest.mark.parametrize(
    "shape", ["dgx_h100", "dgx_a100", "grace_hopper", "cloud_vm_unknown_numa", "offline_cpus"]
)
def test_snapshot_round_trip(tree: Callable[[str], Path], tmp_path: Path, shape: str) -> None:
    original = read(tree(shape))
    archive = tmp_path / "snap.tar.gz"
    count = snapshot(tree(shape), archive)
    with tarfile.open(archive) as tar:
        files = [m for m in tar.getmembers() if m.isfile()]
        assert count == len(files) > 0
        assert all(not m.name.startswith("/") and ".." not in m.name for m in tar.getmembers())
        if sys.version_info >= (3, 12):
            tar.extractall(tmp_path / "out", filter="data")
        else:
            tar.extractall(tmp_path / "out")
    replayed = read(tmp_path / "out")
    assert replayed.replace(root="") == original.replace(root="")


def test_snapshot_of_missing_root(tmp_path: Path) -> None:
    with pytest.raises(TopologyError):
        snapshot(tmp_path / "nowhere", tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


def test_snapshot_of_this_machine(tmp_path: Path) -> None:
    snapshot("/", tmp_path / "host.tar.gz")
    with tarfile.open(tmp_path / "host.tar.gz") as tar:
        tar.extractall(tmp_path / "out")
    host, replayed = read_topology("/"), read(tmp_path / "out")
    assert replayed.cpus == host.cpus and replayed.nodes == host.nodes
    assert replayed.all_gpus == host.all_gpus and replayed.nics == host.nics
