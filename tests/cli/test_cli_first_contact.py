"""A newcomer's first minutes with the ``numarun`` command: what it says about the usual mistakes.

A busy ``--master-port`` on node 0 is one line and exit status 2 before anything starts. Near
misses (a misspelt option or value, ``numarun python train.py``, ``-m train.py``, ``--no-python
train.py``, a script that does not exist) get "did you mean" or the hint for that mistake. The
start line is ``tests/launch/test_startline.py``'s; the plan without flags and why,
``tests/placement/test_defaults.py`` and ``test_explain.py``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

import sysfs_fixtures
from newcomer_runs import LIMIT, numarun, write_hello, write_marker_script

shape_root = sysfs_fixtures.shape_root


@pytest.fixture
def hello(tmp_path: Path) -> str:
    return write_hello(tmp_path)


@pytest.fixture
def marker_script(tmp_path: Path) -> tuple[str, Path]:
    return write_marker_script(tmp_path)


# --- item 5: a busy --master-port on node 0 -----------------------------------------------------


@pytest.mark.parametrize("where", ["127.0.0.1", "0.0.0.0"])
def test_a_busy_master_port_is_one_line_before_anything_starts(
    tmp_path: Path, marker_script: tuple[str, Path], where: str
) -> None:
    script, marker = marker_script
    with socket.socket() as holder:
        holder.bind((where, 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = numarun("--master-port", str(port), script, cwd=tmp_path)
        many = numarun("--nnodes", "2", "--master-port", str(port), script, cwd=tmp_path)
    for job in (done, many):
        assert job.returncode == 2
        assert job.stderr == (
            f"numarun: error: --master-port {port} is in use on this host, where rank 0's "
            "worker must host the job's store: stop what listens there or choose another "
            "--master-port\n"
        )
    assert not marker.exists()


def test_a_port_left_by_closed_connections_is_not_busy(tmp_path: Path, hello: str) -> None:
    # A connection closed by this side stays in TIME_WAIT on the port for a minute; a store
    # binds with SO_REUSEADDR, and so does the check.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: TIME_WAIT on the server's port
        client.close()
    done = numarun("--master-port", str(port), hello, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


# --- item 6: near misses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--nprocs-per-node", "2", "train.py"],
            "unknown option --nprocs-per-node: did you mean --nproc-per-node?",
        ),
        (
            ["--nprocs_per_node=2", "train.py"],
            "unknown option --nprocs_per_node: did you mean --nproc_per_node?",
        ),
        (["--master-adress", "h", "train.py"], "unknown option --master-adress: did you mean "
                                               "--master-addr?"),
        (
            ["python", "train.py", "--lr", "3"],
            "training script 'python' not found: numarun runs Python itself; drop 'python' "
            "(numarun [options] train.py ...)",
        ),
        (
            ["python3", "-u", "-m", "pkg.train"],
            "training script 'python3' not found: numarun runs Python itself; drop 'python3' "
            "(numarun [options] -m pkg.train ...)",
        ),
        (
            ["-m", "train.py"],
            "-m takes a module name, not a file: numarun train.py runs the file, "
            "numarun -m train the module",
        ),
        (
            ["--no-python", "train.py"],
            "--no-python binary 'train.py' not found on PATH: a Python script runs without "
            "--no-python (numarun train.py)",
        ),
        (
            ["--no-python", "tool"],
            "--no-python binary 'tool' not found on PATH: a file in this directory is named "
            "with a path (--no-python ./tool)",
        ),
        (
            ["plan", "--numa-bindng", "cpu"],
            "unknown option --numa-bindng: did you mean --numa-binding?",
        ),
        (["topo", "--jsn"], "unknown option --jsn: did you mean --json?"),
    ],
)
def test_near_misses_get_the_hint_for_that_mistake(
    tmp_path: Path, hello: str, argv: list[str], expected: str
) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    done = numarun(*argv, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"numarun: error: {expected}\n"


def test_an_unknown_option_with_nothing_close_is_refused_as_before(tmp_path: Path) -> None:
    done = numarun("--frobnicate", "train.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "numarun: error: unrecognized arguments: --frobnicate (see 'numarun --help')\n"
    )


# --- near misses: values, script names, options after the script, --h ---------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--numa-binding", "nodes"], "unknown --numa-binding 'nodes': did you mean 'node'? "
                                      "(one of node, socket, exclusive, core-complex, cpu, "
                                      "explicit)"),
        (["--numa-binding", "node", "--mem-binding", "binding"],
         "unknown --mem-binding 'binding': did you mean 'bind'?"),
        (["--start-method", "forkserve"], "unknown --start-method 'forkserve': did you mean "
                                          "'forkserver'?"),
        (["--numa-binding", "gpu"], "unknown --numa-binding 'gpu': use one of node, socket"),
    ],
)  # fmt: skip
def test_a_misspelt_value_gets_the_closest_choice(
    argv: list[str], line: str, tmp_path: Path, marker_script: tuple[str, Path]
) -> None:
    script, marker = marker_script
    done = numarun(*argv, script, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (error,) = done.stderr.splitlines()
    assert error.startswith(f"numarun: error: {line}"), error
    assert not marker.exists()


def test_plan_names_the_closest_mode_too(tmp_path: Path) -> None:
    root = sysfs_fixtures.write_sysfs(sysfs_fixtures.no_gpus(), tmp_path / "tree")
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "plan", "--sysfs-root", str(root), "--numa-binding",
         "sockets"], capture_output=True, text=True, timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown --numa-binding 'sockets': did you mean 'socket'?" in done.stderr


def test_a_script_that_does_not_exist_names_the_closest_file(
    tmp_path: Path, hello: str
) -> None:
    done = numarun("trian.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "numarun: error: training script 'trian.py' not found: did you mean 'train.py'?\n"
    )
    far = numarun(str(tmp_path / "tran.py"), cwd=tmp_path.parent)
    assert f"did you mean {str(tmp_path / 'train.py')!r}?" in far.stderr
    unrelated = numarun("evaluate.py", cwd=tmp_path)
    assert unrelated.stderr == "numarun: error: training script 'evaluate.py' not found\n"


def test_launcher_options_after_the_script_go_to_it_with_one_warning(
    tmp_path: Path,
) -> None:
    (tmp_path / "args.py").write_text("import sys\nprint(sys.argv[1:])\n")
    done = numarun(
        "args.py", "--nproc-per-node", "2", "--nnodes=1", "--nproc_per_node", "3", "--lr", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "numarun: warning: --nproc-per-node, --nnodes, --nproc_per_node after args.py go to "
        "the script, as with torchrun, not to numarun; put numarun's options before the script"
    ]
    # One worker (the launcher read none of them), which got them all, as under torchrun.
    assert done.stdout.splitlines() == [
        "['--nproc-per-node', '2', '--nnodes=1', '--nproc_per_node', '3', '--lr', '1']"
    ]
    plain = numarun("args.py", "--lr", "1", "--log-dir", "runs", cwd=tmp_path)
    assert "warning" not in plain.stderr


@pytest.mark.parametrize("prefix", ["--h", "--he", "--hel"])
def test_h_is_help_as_in_torchrun(prefix: str, tmp_path: Path) -> None:
    done = numarun(prefix, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: numarun ")
