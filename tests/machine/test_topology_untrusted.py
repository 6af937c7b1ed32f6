"""--sysfs-root trees come from anyone: hostile ones get one line and exit 2, in bounded memory
and time, and nothing but regular files inside the tree is ever read."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from numarun.errors import TopologyError
from numarun.machine.topology import read_topology
from sysfs_fixtures import FakeMachine, dgx_h100, no_gpus, one_node_small, write_sysfs

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"
MEMORY_LIMIT = 1 << 30  # far above what a real tree needs; the hostile ones wanted GBs


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _topo(root: Path) -> subprocess.CompletedProcess[str]:
    """``numarun topo --sysfs-root root`` under a 1 GiB address-space limit."""
    return subprocess.run(
        [sys.executable, "-m", "numarun", "topo", "--sysfs-root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )


def _one_line_exit_2(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for word in words:
        assert word in done.stderr


def _tree(tmp_path: Path) -> Path:
    return write_sysfs(one_node_small(), tmp_path / "tree")


def test_65536_possible_nodes_are_refused_in_one_line(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / NODE / "possible").write_text("0-65535\n")
    (root / NODE / "online").unlink()
    _one_line_exit_2(_topo(root), "NUMA node 65535", "1023")


def test_a_symlink_to_dev_zero_is_never_read(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    target = root / CPU / "online"
    target.unlink()
    target.symlink_to("/dev/zero")
    _one_line_exit_2(_topo(root), "online", "symbolic link")


def test_a_symlink_to_a_regular_file_outside_the_tree_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("root:$6$not-a-cpu-list\n")
    target = root / NODE / "node0" / "cpulist"
    target.unlink()
    target.symlink_to(secret)
    done = _topo(root)
    _one_line_exit_2(done, "symbolic link")
    assert "root:$6$" not in done.stderr


def test_a_fifo_does_not_hang_the_reader(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    meminfo = root / NODE / "node0" / "meminfo"
    meminfo.unlink()
    os.mkfifo(meminfo)
    _one_line_exit_2(_topo(root), "meminfo", "not a regular file")


def test_a_fifo_with_a_writer_is_still_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    online = root / CPU / "online"
    online.unlink()
    os.mkfifo(online)
    # A writer that never stops: the reader must neither block nor read it to the end.
    writer = subprocess.Popen(["sh", "-c", f"yes 0-1 > {online}"], stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(TopologyError, match="not a regular file"):
            read_topology(str(root), environ={})
    finally:
        writer.kill()
        writer.wait(timeout=30)


def test_a_huge_file_is_not_read_without_bound(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / CPU / "online").write_bytes(b"0," * (3 << 20) + b"1\n")
    _one_line_exit_2(_topo(root), "online", "larger than 1 MiB")


def test_quadratic_sibling_lists_stop_before_memory_runs_out(tmp_path: Path) -> None:
    # CPU k claims siblings 0..k: each CPU reads its own list and keeps a k-long core, which
    # is n**2 / 2 ids -- 33 million here, well above the memory limit the tree is read under.
    root = tmp_path / "tree"
    cpu_dir = root / CPU
    n = 8192
    (root / NODE).mkdir(parents=True)
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(f"0-{n - 1}\n")
    for cpu in range(n):
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(f"0-{cpu}\n")
    _one_line_exit_2(_topo(root), "CPU ids in all")


def test_every_node_listing_every_cpu_stops_in_bounded_time(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / NODE / "possible").write_text("0-1023\n")
    (root / NODE / "online").write_text("0-1023\n")
    for node in range(1024):
        folder = root / NODE / f"node{node}"
        folder.mkdir(exist_ok=True)
        (folder / "cpulist").write_text("0-65535\n")
    _one_line_exit_2(_topo(root), "CPU ids in all")


def test_a_long_distance_row_keeps_only_the_columns_it_needs(tmp_path: Path) -> None:
    root = write_sysfs(no_gpus(), tmp_path / "tree")
    (root / NODE / "node0" / "distance").write_text("10 21" + " 99" * 200_000 + "\n")
    topology = read_topology(str(root), environ={})
    assert topology.nodes[0].distances == (10, 21)


def test_absurd_numbers_are_read_without_a_traceback(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / NODE / "node0" / "meminfo").write_text(f"Node 0 MemTotal: {'9' * 5000} kB\n")
    for index in (root / CPU / "cpu0" / "cache").iterdir():
        (index / "size").write_text("9" * 5000 + "K\n")
    done = _topo(root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_error_lines_escape_control_characters_from_the_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / NODE / "node0" / "cpulist").write_text("\x1b[2J" + "x" * 500 + "\n")
    done = _topo(root)
    _one_line_exit_2(done, "not a CPU list")
    assert "\x1b" not in done.stderr and len(done.stderr) < 600


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "0,\u0661"])
def test_odd_visible_devices_stop_the_list_as_cuda_does(tmp_path: Path, value: str) -> None:
    # CUDA stops at the first entry that is not a device index; so does numarun, without a
    # traceback for digits int() cannot read or numbers too long to convert.
    root = _tree(tmp_path)
    topology = read_topology(str(root), environ={"CUDA_VISIBLE_DEVICES": value})
    assert len(topology.gpus) == (1 if value.startswith("0,") else 0)


def _svg(root: Path, out: Path, command: str = "topo") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", command, "--sysfs-root", str(root), "--svg", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("machine", [no_gpus, dgx_h100])
def test_one_core_claiming_every_cpu_is_shown_without_a_traceback(
    machine: Callable[[], FakeMachine], tmp_path: Path
) -> None:
    # CPU 0's siblings are all 65536 ids: its core then spans both NUMA nodes and the second
    # node had no core of its own (IndexError in the text view; JSON and plan were fine).
    root = write_sysfs(machine(), tmp_path / "tree")
    (root / CPU / "cpu0" / "topology" / "thread_siblings_list").write_text("0-65535\n")
    done = _topo(root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "node 1:" in done.stdout


def _nic_names(root: Path, *names: bytes) -> None:
    """Give the first ethernet NIC of ``root`` these interface names (raw bytes)."""
    (net,) = [path for path in root.glob("sys/devices/*/*/net") if any(path.iterdir())][:1]
    for child in net.iterdir():
        for entry in child.iterdir():
            entry.unlink()
        child.rmdir()
    for name in names:
        os.mkdir(os.fsencode(net) + b"/" + name)


HOSTILE_NAMES = (b"en\xffo1", b"x\x1b[2Jred", b"tab\tand\x7f<&>")


def test_undecodable_and_control_characters_in_names_are_escaped_in_the_text(
    tmp_path: Path,
) -> None:
    root = write_sysfs(dgx_h100(), tmp_path / "tree")
    _nic_names(root, *HOSTILE_NAMES)
    done = _topo(root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "en\\xffo1" in done.stdout and "x\\x1b[2Jred" in done.stdout
    assert "tab\\tand\\x7f<&>" in done.stdout
    assert not any((ord(c) < 32 and c != "\n") or ord(c) == 127 for c in done.stdout)
    listed = subprocess.run(
        [sys.executable, "-m", "numarun", "topo", "--json", "--sysfs-root", str(root)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0 and "\x1b" not in listed.stdout, listed.stderr[-2000:]


@pytest.mark.parametrize("command", ["topo", "plan"])
def test_hostile_names_give_a_well_formed_svg(command: str, tmp_path: Path) -> None:
    import xml.etree.ElementTree as ElementTree

    root = write_sysfs(dgx_h100(), tmp_path / "tree")
    _nic_names(root, *HOSTILE_NAMES)
    out = tmp_path / "machine.svg"
    out.write_text("before")
    done = _svg(root, out, command)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    text = out.read_text(encoding="utf-8")  # UTF-8 throughout: no surrogate left in it
    document = ElementTree.fromstring(text)  # raises on a control character
    shown = " ".join(document.itertext())
    assert "en\\xffo1" in shown and "x\\x1b[2Jred" in shown and "<&>" in shown
