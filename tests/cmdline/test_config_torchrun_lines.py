"""Real torchrun command lines (tests/data/torchrun_command_lines.txt, collected from public
training repositories and documentation) mean the same to numarun as to torchrun.

Each line is parsed side by side: by torch 2.13's own torchrun parser (``get_args_parser``,
then ``config_from_args``, with ``--standalone`` applied as ``torchrun`` applies it) and by
numarun's :func:`numarun.cmdline.config.parse_args`. The deliberate differences compared here
are the README's: ``--standalone`` stays numarun's static single-node rendezvous, and a single
static node without a port gets a free port instead of 29500.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from numarun.cmdline.config import parse_args

CORPUS = Path(__file__).resolve().parents[1] / "data" / "torchrun_command_lines.txt"
LINES = [
    line.strip()
    for line in CORPUS.read_text().splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]
# Variables that would change either parser's answer (PET_* defaults, scheduler facts).
_CLEARED = ("PET_", "SLURM_", "OMPI_", "MASTER_", "TORCHELASTIC_", "TORCH_ELASTIC_")


def torchruns_meaning(argv: list[str]):  # (args, LaunchConfig) as torchrun 2.13 builds them
    from torch.distributed.run import config_from_args, get_args_parser

    args = get_args_parser().parse_args(argv)
    if args.standalone:  # what torchrun's run() does before config_from_args
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = "standalone"
    config, _cmd, _cmd_args = config_from_args(args)
    return args, config


def test_the_corpus_is_real_and_varied() -> None:
    assert len(LINES) >= 30
    text = "\n".join(LINES)
    for flag in ("c10d", "--rdzv_conf", "--max_restarts", "--nnodes=1:4", "--standalone", "-m "):
        assert flag in text


@pytest.mark.parametrize("line", LINES)
def test_a_real_command_line_means_the_same_as_under_torchrun(
    line: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in list(os.environ):
        if key.startswith(_CLEARED):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # config_from_args would set it in os.environ
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(line)
    args, theirs = torchruns_meaning(argv)
    ours = parse_args(argv)

    assert ours.nproc_per_node == theirs.nproc_per_node
    assert (ours.min_nodes, ours.max_nodes) == (theirs.min_nodes, theirs.max_nodes)
    assert ours.max_restarts == theirs.max_restarts
    assert ours.role == theirs.role
    assert (ours.tee, ours.redirects) == (args.tee, args.redirects)
    assert ours.local_ranks_filter == args.local_ranks_filter
    assert ours.entrypoint == args.training_script
    assert ours.args == tuple(args.training_script_args)
    assert (ours.entrypoint_kind == "module") == args.module
    conf = {key: value for key, value in theirs.rdzv_configs.items() if key != "rank"}
    if not re.search(r"(?:^|[\s,=])timeout=", line):
        del conf["timeout"]  # torch's LaunchConfig adds its default (900 s) itself
    if args.standalone:
        # Deliberate difference: one node, numarun's static rendezvous on a free port.
        assert ours.rdzv_backend == "static" and ours.nnodes == 1 and ours.master_port is None
        return
    assert dict(ours.rdzv_conf) == {key: str(value) for key, value in conf.items()}
    assert ours.rdzv_backend == theirs.rdzv_backend
    if theirs.rdzv_backend == "static":
        host, _, port = theirs.rdzv_endpoint.rpartition(":")
        assert ours.master_addr == host
        assert ours.node_rank == theirs.rdzv_configs["rank"]
        explicit = any(flag in line for flag in ("master_port", "master-port", "rdzv_endpoint"))
        if explicit or theirs.max_nodes > 1:
            assert ours.master_port == int(port)
        else:
            assert ours.master_port is None  # deliberate: a free port, not 29500
    else:
        assert ours.rdzv_endpoint == theirs.rdzv_endpoint
        assert ours.run_id == theirs.run_id
