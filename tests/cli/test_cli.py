"""The `numarun topo | plan | snapshot` subcommands, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from numarun.cli import main
from sysfs_fixtures import dgx_a100, dgx_h100, grace_hopper, write_sysfs


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def h100_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sysfs(dgx_h100(), tmp_path_factory.mktemp("h100"))


def test_topo_on_this_machine_shows_every_online_cpu() -> None:
    result = run_cli("topo")
    assert result.returncode == 0, result.stderr
    assert "package 0" in result.stdout
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    assert online in result.stdout


def test_topo_json_lists_gpus_with_their_nodes(h100_root: Path, capsys) -> None:
    assert main(["topo", "--sysfs-root", str(h100_root), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    text = json.dumps(document)
    assert "0000:18:00.0" in text and "0000:db:00.0" in text


def test_plan_json_contract_node_mode(h100_root: Path, capsys) -> None:
    assert main(["plan", "--sysfs-root", str(h100_root), "--numa-binding", "node", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    ranks = document["ranks"]
    assert [rank["local_rank"] for rank in ranks] == list(range(8))
    node0 = list(range(0, 56)) + list(range(112, 168))
    node1 = list(range(56, 112)) + list(range(168, 224))
    assert [rank["cpus"] for rank in ranks] == [node0] * 4 + [node1] * 4
    assert [rank["mems"] for rank in ranks] == [[0]] * 4 + [[1]] * 4
    assert [rank["gpu"] for rank in ranks] == list(range(8))


def test_plan_table_shows_ranges_a_person_can_check(tmp_path: Path) -> None:
    root = write_sysfs(dgx_a100(), tmp_path)
    result = run_cli("plan", "--sysfs-root", str(root), "--numa-binding", "exclusive")
    assert result.returncode == 0, result.stderr
    # GPU 0 sits on node 3 with GPU 1: it takes the first 8 of node 3's 16 cores.
    assert "48-55,176-183" in result.stdout
    assert "56-63,184-191" in result.stdout


def test_plan_explicit_rank_cpus(h100_root: Path, capsys) -> None:
    argv = ["plan", "--sysfs-root", str(h100_root), "--rank-cpus", "0-3", "--rank-cpus", "56,57"]
    assert main([*argv, "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert [rank["cpus"] for rank in ranks] == [[0, 1, 2, 3], [56, 57]]


def test_plan_cpus_allowed_restricts_the_plan(h100_root: Path, capsys) -> None:
    argv = ["plan", "--sysfs-root", str(h100_root), "--numa-binding", "node"]
    assert main([*argv, "--cpus-allowed", "0-7,56-63", "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert ranks[0]["cpus"] == list(range(8))
    assert ranks[7]["cpus"] == list(range(56, 64))


def test_socket_mode_survives_memory_only_nodes(tmp_path: Path, capsys) -> None:
    root = write_sysfs(grace_hopper(), tmp_path)
    assert main(["plan", "--sysfs-root", str(root), "--numa-binding", "socket", "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert ranks[0]["cpus"] == list(range(72))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["plan", "--numa-binding", "bogus"], "unknown --numa-binding 'bogus': use one of"),
        (["plan", "--numa-binding", "node", "--nproc-per-node", "0"], "at least 1"),
        (["plan", "--numa-binding", "node", "--nproc-per-node", "two"], "positive integer"),
        (["plan", "--numa-binding", "node", "--sysfs-root", "/nonexistent"], "/nonexistent"),
        (["topo", "--sysfs-root", "/nonexistent"], "/nonexistent"),
        (["topo", "--cpus-allowed", "3-1"], "runs backwards"),
        (["topo", "--bogus-flag"], "unrecognized arguments"),
        (["plan", "--numa-binding", "node", "--rank-cpus", "0"], "cannot be combined"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("numarun: error: ")
    assert needle in lines[0]


def test_more_ranks_than_gpus_is_refused(h100_root: Path) -> None:
    result = run_cli(
        "plan", "--sysfs-root", str(h100_root), "--numa-binding", "node", "--nproc-per-node", "9"
    )
    assert result.returncode == 2
    assert "8 visible GPU" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_binding_fallback_plans_unbound_with_a_warning(h100_root: Path, capsys) -> None:
    argv = ["plan", "--sysfs-root", str(h100_root), "--numa-binding", "node", "--nproc-per-node"]
    assert main([*argv, "9", "--binding-fallback", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["bound"] is False
    assert any("9 ranks" in warning for warning in document["warnings"])


def test_snapshot_replays_to_the_same_plan(h100_root: Path, tmp_path: Path, capsys) -> None:
    archive = tmp_path / "machine.tar.gz"
    assert main(["snapshot", str(archive), "--sysfs-root", str(h100_root)]) == 0
    replay = tmp_path / "replay"
    with tarfile.open(archive) as tar:
        tar.extractall(replay, filter="data")
    capsys.readouterr()
    plans = []
    for root in (h100_root, replay):
        assert (
            main(["plan", "--sysfs-root", str(root), "--numa-binding", "exclusive", "--json"]) == 0
        )
        plans.append(json.loads(capsys.readouterr().out)["ranks"])
    assert plans[0] == plans[1]


def test_snapshot_of_this_machine(tmp_path: Path) -> None:
    archive = tmp_path / "here.tar.gz"
    result = run_cli("snapshot", str(archive))
    assert result.returncode == 0, result.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert any(name.endswith("sys/devices/system/cpu/online") for name in names)


def test_finding_gpus_planning_and_launching_never_import_torch(
    h100_root: Path, tmp_path: Path
) -> None:
    # torchrun's binding needs torch (and initialises CUDA) in the launcher; numarun must not.
    worker = tmp_path / "w.py"
    worker.write_text("pass\n")
    code = (
        "import sys\n"
        "from numarun.cli import main\n"
        f"assert main(['topo', '--sysfs-root', {str(h100_root)!r}]) == 0\n"
        f"assert main(['plan', '--sysfs-root', {str(h100_root)!r}, '--numa-binding', 'node'])"
        " == 0\n"
        "assert main(['topo']) == 0\n"
        f"assert main(['--nproc-per-node', '2', '--numa-binding', 'cpu', {str(worker)!r}]) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# --- help, version and the example machines of the docs ------------------------------------------


def test_help_lists_every_subcommand_and_help_and_version_work() -> None:
    from numarun import __version__
    from numarun.cli import SUBCOMMANDS

    shown = run_cli("--help")
    assert shown.returncode == 0, shown.stderr
    for name in (*SUBCOMMANDS, "help"):
        assert f"numarun {name} " in shown.stdout, name
    assert "--nproc-per-node" in shown.stdout
    assert run_cli("help").stdout == shown.stdout
    plan_help = run_cli("help", "plan")
    assert plan_help.returncode == 0 and "usage: numarun plan" in plan_help.stdout
    version = run_cli("--version")
    assert (version.returncode, version.stdout) == (0, f"numarun {__version__}\n")
    wrong = run_cli("help", "nope")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("archive", "machine"),
    [("dgx-a100", dgx_a100), ("dgx-h100", dgx_h100), ("grace-hopper", grace_hopper)],
)
def test_shipped_example_trees_are_the_test_machines(
    tmp_path: Path, archive: str, machine: object
) -> None:
    from numarun.machine.topology import read_topology
    from numarun.machine.topotext import render_topology

    with tarfile.open(EXAMPLES / "sysfs" / f"{archive}.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    fixture = write_sysfs(machine(), tmp_path / "fixture")  # type: ignore[operator]
    shipped = render_topology(read_topology(tmp_path / "x", environ={}))
    assert shipped == render_topology(read_topology(fixture, environ={}))


def test_docs_examples_run_on_the_shipped_dgx_a100(tmp_path: Path) -> None:
    # docs/machine-and-plans.md's `numarun topo|plan --sysfs-root /tmp/dgx-a100` blocks, reproduced.
    with tarfile.open(EXAMPLES / "sysfs" / "dgx-a100.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    readme = (EXAMPLES.parent / "docs" / "machine-and-plans.md").read_text()
    for command in ("topo", "plan"):
        flags = ["--numa-binding", "exclusive"] if command == "plan" else []
        done = run_cli(command, "--sysfs-root", str(tmp_path), *flags)
        assert done.returncode == 0, done.stderr
        for line in done.stdout.splitlines()[:4]:
            assert line in readme, line
    assert "examples/sysfs/dgx-a100.tar.gz" in readme
