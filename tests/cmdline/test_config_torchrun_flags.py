"""torchrun's remaining flags and environment, each checked against torch 2.13 where it can be.

PET_* for every launcher flag, flag prefixes (against torch's own argument parser), the
``${local_rank}`` macro (against ``string.Template``, which torchrun uses), IPv6 master
addresses, ``--nproc-per-node cpu`` under ``taskset``, and one real job per launcher comparing
``--tee`` prefixes, ``--duplicate-stdout-filters``, ``--virtual-local-rank`` and ``[::1]``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import string
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numarun.cmdline import config as launch_config
from numarun.cmdline import options as launch_options
from numarun.errors import UsageError
from numarun.launch.workersetup import rank_env, substitute_local_rank, worker_argv
from numarun.placement.workerenv import free_port

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
FLAGS_WORKER = str(PROGRAMS / "torchrun_flags_report.py")
ALLREDUCE = str(PROGRAMS / "gloo_allreduce.py")
CLEAN_ENV: dict[str, str] = {"PATH": os.environ.get("PATH", os.defpath)}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
NUMARUN = [sys.executable, "-m", "numarun"]
TORCHRUN_2_14 = frozenset({"--log-line-prefix-template"})  # torchrun 2.14's flags numarun has


def parse(*argv: str, **environ: str) -> launch_config.LaunchConfig:
    config = launch_config.parse_args(list(argv), {**CLEAN_ENV, **environ})
    return config.replace(run_id="fixed")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


# --- PET_* for every flag ------------------------------------------------------------------------

# dest -> (arguments the flag needs beside it, values to try). Each value is tried as the flag
# and as PET_<NAME>; the outcomes must be the same config or the same refusal. A new launcher
# flag needs an entry here: a PET_* variable must never be ignored silently.
SAMPLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "nproc_per_node": ((), ("3", "x")),
    "nnodes": ((), ("2", "0")),
    "node_rank": (("--nnodes", "2"), ("1", "-1")),
    "master_addr": ((), ("h0", "[::1]")),
    "master_port": ((), ("1234", "x")),
    "standalone": ((), ("1", "yes")),
    "rdzv_backend": ((), ("static", "nope")),
    "rdzv_endpoint": ((), ("h1:77", "h:x")),
    "rdzv_id": ((), ("job", "a/b")),
    "rdzv_conf": ((), ("", "bad", "timeout=60")),
    "max_restarts": ((), ("0", "-1", "2")),
    "monitor_interval": ((), ("5", "x")),
    "local_addr": (("--rdzv-backend", "c10d"), ("node7",)),
    "start_method": ((), ("fork", "exec")),
    "event_log_handler": ((), ("console", "nope")),
    "role": ((), ("trainer",)),
    "module": ((), ("1", "2")),
    "no_python": ((), ("1", "x")),
    "run_path": ((), ("1", "x")),
    "log_dir": ((), ("/tmp/l",)),
    "redirects": ((), ("3", "9")),
    "tee": ((), ("1", "9")),
    "local_ranks_filter": ((), ("0", "7")),
    "duplicate_stdout_filters": ((), ("a,,b,c",)),
    "duplicate_stderr_filters": ((), ("x",)),
    "logs_specs": ((), ("default", "custom")),
    "virtual_local_rank": ((), ("1", "on")),
    "numa_binding": ((), ("cpu", "nope")),
    "rank_cpus": ((), ("0",)),
    "mem_binding": (("--numa-binding", "cpu"), ("local", "nope")),
    "binding_fallback": ((), ("1", "x")),
    "signals_to_handle": ((), ("SIGUSR1", "SIGNOPE")),
    "grace_period": ((), ("7", "-1")),
    "dry_run": ((), ("1", "x")),
    "quiet": ((), ("1", "x")),
    "sysfs_root": (("--dry-run",), ("/nonexistent",)),
    "cpus_allowed": (("--numa-binding", "cpu"), ("0", "x")),
    "hang_timeout": ((), ("30", "x")),
    "preload": ((), ("torch,json", "not-a-module")),
    "preload_required": (("--preload", "torch"), ("1", "x")),
    "preload_late": (("--preload", "torch"), ("1", "x")),
    "log_line_prefix_template": ((), ("${rank}: ",)),
    "diagnostics_store": (("--rdzv-backend", "c10d"), ("rendezvous", "own", "nope")),
}


def _outcome(argv: list[str], **environ: str) -> object:
    try:
        return parse(*argv, **environ)
    except UsageError:
        return UsageError


@pytest.mark.parametrize("option", launch_options._OPTIONS, ids=lambda option: option.names[0])
def test_every_flags_pet_variable_is_honoured_or_refused(option: launch_options._Option) -> None:
    assert option.dest in SAMPLES, f"add sample values for {option.names[0]} to SAMPLES"
    context, values = SAMPLES[option.dest]
    default = _outcome([*context, "t.py"])
    long_names = [name for name in option.names if name.startswith("--")]
    for name in long_names:
        key = "PET_" + name[2:].upper().replace("-", "_")
        noticed = False
        for value in values:
            flag = [name] if option.flag else [name, value]
            by_env = _outcome([*context, "t.py"], **{key: value})
            if option.repeat:
                with pytest.raises(UsageError, match=key):
                    parse(*context, "t.py", **{key: value})
                noticed = True
                continue
            if option.flag and value not in ("0", "1"):
                assert by_env is UsageError, (key, value)
            else:
                assert by_env == _outcome([*context, *flag, "t.py"]), (key, value)
            noticed = noticed or by_env != default
        assert noticed, f"{key} changed nothing and was not refused"


# --- prefixes ------------------------------------------------------------------------------------


def test_every_prefix_torchrun_accepts_means_the_same_flag_in_numarun() -> None:
    # numarun's own options never make a prefix ambiguous that torchrun reads as one of its
    # own (--h is --help there, not ambiguous with --hang-timeout).
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    options = (*launch_options._OPTIONS, *launch_options._PARSER_ONLY)
    mine = {name: option for option in options for name in option.names}
    theirs = {name.replace("_", "-") for name in parser._option_string_actions}
    # torchrun's flags of releases newer than the one tested here (numarun reads them anyway).
    later = TORCHRUN_2_14 - theirs
    assert {
        name.replace("_", "-") for name in mine if name.startswith("--")
    } - theirs == launch_options.NUMARUN_ONLY | later
    checked = 0
    for full in parser._option_string_actions:
        if not full.startswith("--") or full not in mine:
            continue  # a flag numarun does not have (yet)
        for end in range(3, len(full)):
            prefix = full[:end]
            option_strings = [o for o in parser._option_string_actions if o.startswith(prefix)]
            if len(option_strings) != 1:
                continue  # torchrun (argparse on Python 3.11) refuses it as ambiguous
            if any(flag.startswith(prefix.replace("_", "-")) for flag in later):
                # --log- is --log-dir for torchrun 2.13 and ambiguous from 2.14 on: numarun
                # reads it as the newer torchrun does.
                with pytest.raises(UsageError, match="ambiguous option"):
                    launch_options._spell_out(prefix, mine)
                continue
            spelled = launch_options._spell_out(prefix, mine)
            assert spelled in mine and mine[spelled] is mine[full], (prefix, spelled)
            checked += 1
    assert checked > 100


def test_prefixes_only_before_the_script_and_ambiguity_is_one_line() -> None:
    config = parse("--nnode", "1", "--tee", "3", "t.py", "--nnode", "1", "--te", "x")
    assert (config.nnodes, config.tee) == (1, "3")
    assert config.args == ("--nnode", "1", "--te", "x")
    with pytest.raises(UsageError, match="ambiguous option: --dup could match"):
        parse("--dup", "x", "t.py")


# --- ${local_rank} -------------------------------------------------------------------------------


@given(st.text(alphabet="${}_alocrnk0X ", max_size=30))
def test_local_rank_macro_matches_torchruns_template_except_double_dollar(text: str) -> None:
    expected = string.Template(text).safe_substitute(local_rank="7")
    got = substitute_local_rank([text], 7)[0]
    if "$$" not in text:
        assert got == expected
    else:  # torchrun turns $$ into $; numarun keeps the argument as written there
        assert got.replace("$$", "$") == expected


def test_local_rank_macro_in_each_ranks_argv() -> None:
    config = parse("--nproc-per-node", "2", "t.py", "--out=ckpt_${local_rank}", "$local_rank")
    assert worker_argv(config, local_rank=1)[-2:] == ["--out=ckpt_1", "1"]
    assert worker_argv(config)[-2:] == ["--out=ckpt_${local_rank}", "$local_rank"]


# --- environment-changing flags ------------------------------------------------------------------


def test_virtual_local_rank_env_and_binding_follow_the_real_local_rank() -> None:
    config = parse("--nproc-per-node", "2", "--virtual-local-rank", "t.py")
    env = rank_env(config, 1, base={"CUDA_VISIBLE_DEVICES": "3, 5"}, master_port=1, error_file="")
    assert (env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"], env["RANK"]) == ("0", "5", "1")
    env = rank_env(config, 1, base={}, master_port=1, error_file="")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    with pytest.raises(UsageError, match="local rank 1 has no entry"):
        rank_env(config, 1, base={"CUDA_VISIBLE_DEVICES": "3"}, master_port=1, error_file="")


def test_bracketed_ipv6_master_addr_reaches_workers_bare() -> None:
    assert parse("--master-addr", "[::1]", "t.py").master_addr == "::1"
    assert parse("--rdzv-endpoint", "[::1]:29400", "t.py").master_addr == "::1"
    assert parse("--master-addr", "[::1]", "--rdzv-endpoint", "[::1]:5", "t.py").master_port == 5


def test_event_log_handler_and_logs_specs() -> None:
    assert parse("--event-log-handler", "console", "t.py").event_log_handler == "console"
    with pytest.raises(UsageError, match="not one of torchrun's handlers"):
        parse("--event-log-handler", "kafka", "t.py")
    parse("--logs-specs", "default", "t.py")
    with pytest.raises(UsageError, match="default log layout only"):
        parse("--logs-specs", "mine", "t.py")


def test_nproc_per_node_cpu_counts_this_process_affinity() -> None:
    allowed = len(os.sched_getaffinity(0))
    assert parse("--nproc-per-node", "cpu", "t.py").nproc_per_node == allowed
    assert parse("--nproc-per-node", "auto", "t.py").nproc_per_node >= 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_nproc_per_node_cpu_under_taskset_matches_torchrun(tmp_path: Path) -> None:
    cpu = str(min(os.sched_getaffinity(0)))
    dry = subprocess.run(
        ["taskset", "-c", cpu, *NUMARUN, "--nproc-per-node", "cpu", "--dry-run", FLAGS_WORKER],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("local rank ") == 1
    torch_run = subprocess.run(
        ["taskset", "-c", cpu, *TORCHRUN, "--nproc-per-node", "cpu", FLAGS_WORKER],
        capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert torch_run.returncode == 0, torch_run.stderr
    assert sum(line.startswith("{") for line in torch_run.stdout.splitlines()) == 1


# --- one real job per launcher, side by side -------------------------------------------------


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_tee_filters_virtual_rank_macro_and_ipv6_side_by_side_with_torchrun(
    tmp_path: Path,
) -> None:
    addr = "[::1]" if _has_ipv6_loopback() else "127.0.0.1"
    odd = ["a${local_rank}", "$local_rank", "${local_rank}x", "$local_ranks", "$HOME", "$${x}"]
    flags = [
        "--nproc-per-node", "2", "--role", "trainer", "--tee", "3", "--virtual-local-rank",
        "--duplicate-stdout-filters", "keep,,this,other", "--duplicate-stderr-filters", "keep",
        "--master-addr", addr, "--rdzv-id", "side",
    ]  # fmt: skip
    results = {}
    for name, launcher in (("numarun", NUMARUN), ("torchrun", TORCHRUN)):
        logs = tmp_path / name
        done = subprocess.run(
            [*launcher, *flags, "--master-port", str(free_port()), "--log-dir", str(logs),
             FLAGS_WORKER, *odd],
            capture_output=True, text=True, env=_env(CUDA_VISIBLE_DEVICES="4,6"), timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, (name, done.stderr)
        (attempt,) = logs.glob("side*/attempt_0")
        reports = {}
        console = []
        for line in done.stdout.splitlines():
            prefix, sep, text = line.partition("]:")
            if not sep or not prefix.startswith("[trainer"):
                continue  # torchrun's own log lines
            console.append(line)
            if text.startswith("{"):
                reports[prefix + "]:"] = json.loads(text)
        results[name] = {
            "reports": reports,
            "console": sorted(line for line in console if not line.endswith("}")),
            "stderr": sorted(
                line for line in done.stderr.splitlines() if line.startswith("[trainer")
            ),
            "filtered_out": sorted((attempt / "filtered_stdout.log").read_text().splitlines()),
            "filtered_err": sorted((attempt / "filtered_stderr.log").read_text().splitlines()),
        }
    mine, theirs = results["numarun"], results["torchrun"]
    assert sorted(mine["reports"]) == sorted(theirs["reports"]) == ["[trainer0]:", "[trainer1]:"]
    for prefix, report in mine["reports"].items():
        peer = theirs["reports"][prefix]
        assert report["local_rank"] == peer["local_rank"] == "0"
        assert report["cuda"] == peer["cuda"] == ["4", "6"][report["rank"]]
        assert report["master_addr"] == peer["master_addr"]
        assert report["master_addr"] == addr.strip("[]")
        assert report["argv"][:-1] == peer["argv"][:-1]  # all but "$${x}"
        assert (report["argv"][-1], peer["argv"][-1]) == ("$${x}", "${x}")
    assert mine["console"] == theirs["console"]
    assert mine["stderr"] == theirs["stderr"] == ["[trainer0]:err keep 0", "[trainer1]:err keep 1"]
    assert mine["filtered_out"] == theirs["filtered_out"]
    assert mine["filtered_out"] == [
        "[trainer0]:keep,this 0", "[trainer0]:other 0",
        "[trainer1]:keep,this 1", "[trainer1]:other 1",
    ]  # fmt: skip
    assert mine["filtered_err"] == theirs["filtered_err"] == mine["stderr"]


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_a_gloo_job_on_bracketed_ipv6_loopback(tmp_path: Path) -> None:
    done = subprocess.run(
        [*NUMARUN, "--nproc-per-node", "2", "--master-addr", "[::1]", ALLREDUCE],
        capture_output=True, text=True, env=_env(), timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sums = [json.loads(line)["sum"] for line in done.stdout.splitlines() if line.startswith("{")]
    assert sums == [3.0, 3.0]


def test_prefix_template_and_already_prefixed_lines(tmp_path: Path) -> None:
    # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]: ' is numarun's old prefix; torch's
    # excepthook writes the same prefix itself, which must not appear twice.
    worker = tmp_path / "w.py"
    worker.write_text(
        "import os, sys\n"
        "print('plain', flush=True)\n"
        "print(f\"[rank{os.environ['RANK']}]: from the excepthook\", flush=True)\n"
    )
    done = subprocess.run(
        [*NUMARUN, "--tee", "1", str(worker)],
        capture_output=True, text=True, timeout=120,
        env=_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: "),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[rank0]: plain", "[rank0]: from the excepthook"]


def test_log_line_prefix_template_flag_and_hostname_as_torchrun_2_14_reads_them(
    tmp_path: Path,
) -> None:
    # torchrun 2.14 added --log-line-prefix-template (over the variable) and ${hostname}: the
    # same lines from numarun under any torch; beside torchrun where its parser has the flag.
    from torch.distributed.run import get_args_parser

    worker = tmp_path / "w.py"
    worker.write_text("import os\nprint('line', os.environ['RANK'], flush=True)\n")
    template = "${hostname}:${rank}: "
    launchers = {"numarun": NUMARUN}
    if "--log-line-prefix-template" in get_args_parser()._option_string_actions:
        launchers["torchrun"] = TORCHRUN
    consoles = {}
    for name, launcher in launchers.items():
        done = subprocess.run(
            [*launcher, "--nproc-per-node", "2", "--master-port", str(free_port()), "--tee", "1",
             "--log-dir", str(tmp_path / name), "--log_line_prefix_template", template,
             str(worker)],
            capture_output=True, text=True, timeout=300,
            env=_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[env${rank}]:"),
        )  # fmt: skip
        assert done.returncode == 0, (name, done.stderr)
        consoles[name] = sorted(line for line in done.stdout.splitlines() if "line" in line)
    host = socket.gethostname()
    assert consoles["numarun"] == [f"{host}:0: line 0", f"{host}:1: line 1"]
    assert consoles.get("torchrun", consoles["numarun"]) == consoles["numarun"]
