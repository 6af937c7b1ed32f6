"""numarun.placement.binding on this machine, with real processes.

Affinity and memory policy are applied in forked children (never in the pytest process), read
back there, and sent to the parent through a pipe. Failures the machine cannot produce (seccomp
EPERM, a second NUMA node, a kernel without MPOL_PREFERRED_MANY) are simulated through
``check_mem_policy``'s ``set_mempolicy`` parameter and by replacing the Mems_allowed / has_memory
readers.
"""

from __future__ import annotations

import errno
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from numarun.errors import BindingError, UsageError
from numarun.machine.cpulist import format_cpulist
from numarun.placement import binding
from numarun.placement.binding import (
    MEM_MODES,
    MPOL_BIND,
    MPOL_DEFAULT,
    MPOL_PREFERRED_MANY,
    MemPolicy,
    apply_in_child,
    check_cpus,
    check_mem_policy,
    current_cpus,
    describe_self,
    get_mem_policy,
    get_parent_death_signal,
    is_child_subreaper,
    mem_policy_for,
    set_child_subreaper,
    set_parent_death_signal,
)

ALLOWED = current_cpus()
OUTSIDE_CPU = max(ALLOWED) + 1
FIRST_LINE_CPUS = (
    "import sys\n"
    "for line in open('/proc/self/status'):\n"
    "    if line.startswith('Cpus_allowed_list:'):\n"
    "        sys.stdout.write(line.split(':')[1].strip() + '\\n')\n"
)
WAIT_LIMIT_S = 10.0


def _mems_allowed_text() -> str:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Mems_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise AssertionError("no Mems_allowed_list in /proc/self/status")


def _wait_bounded(pid: int, limit: float = WAIT_LIMIT_S) -> int:
    """waitpid with a deadline; returns the raw status."""
    deadline = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"process {pid} did not end within {limit} s")
        time.sleep(0.01)


def in_child(function: Callable[[], Any]) -> Any:
    """Run ``function`` in a forked child; return its result or re-raise its exception."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            try:
                payload = ("ok", function())
            except BaseException as exc:
                payload = ("raised", exc)
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(payload, out)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as source:
        data = source.read()
    status = _wait_bounded(pid)
    assert os.waitstatus_to_exitcode(status) == 0
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise value
    return value


@pytest.fixture
def parent_state() -> Iterator[None]:
    """The pytest process's affinity and memory policy must be the same after the test."""
    cpus, policy = current_cpus(), get_mem_policy()
    yield
    assert current_cpus() == cpus
    assert get_mem_policy() == policy


# --- CPU affinity in children ------------------------------------------------------------------


@pytest.mark.parametrize("cpu", ALLOWED)
def test_forked_child_is_bound_to_the_cpu(cpu: int, parent_state: None) -> None:
    def child() -> tuple[int, ...]:
        apply_in_child([cpu], None)
        return current_cpus()

    assert in_child(child) == (cpu,)


@pytest.mark.parametrize("cpu", ALLOWED)
def test_preexec_fn_binds_before_the_program_runs(cpu: int, parent_state: None) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FIRST_LINE_CPUS],
        preexec_fn=lambda: apply_in_child([cpu], None),
        capture_output=True,
        text=True,
        timeout=WAIT_LIMIT_S,
        check=True,
    )
    assert result.stdout.splitlines()[0] == str(cpu)


@pytest.mark.parametrize("cpu", ALLOWED)
def test_binding_survives_exec_of_python(cpu: int, parent_state: None) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            apply_in_child([cpu], None)
            os.execv(sys.executable, [sys.executable, "-c", FIRST_LINE_CPUS])
        finally:
            os._exit(127)
    os.close(write_end)
    with os.fdopen(read_end) as source:
        first_line = source.readline().strip()
    assert os.waitstatus_to_exitcode(_wait_bounded(pid)) == 0
    assert first_line == str(cpu)


def test_unbound_child_inherits_every_allowed_cpu(parent_state: None) -> None:
    def child() -> tuple[int, ...]:
        apply_in_child(None, None)
        return current_cpus()

    assert in_child(child) == ALLOWED


def test_apply_in_child_raises_oserror_for_a_cpu_it_cannot_have() -> None:
    def child() -> None:
        apply_in_child([OUTSIDE_CPU], None)

    with pytest.raises(OSError) as raised:
        in_child(child)
    assert raised.value.errno == errno.EINVAL


# --- memory policy in children -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (MemPolicy("bind", (0,)), ("bind", (0,))),
        (MemPolicy("preferred", (0,)), ("preferred", (0,))),
        (MemPolicy("interleave", (0,)), ("interleave", (0,))),
        (MemPolicy("local", ()), ("local", ())),
    ],
)
def test_memory_policy_applied_in_child_reads_back(
    policy: MemPolicy, expected: tuple[str, tuple[int, ...]], parent_state: None
) -> None:
    def child() -> tuple[str, tuple[int, ...]]:
        before = get_mem_policy()
        assert before == ("default", ())
        apply_in_child(None, policy)
        return get_mem_policy()

    assert in_child(child) == expected


def test_memory_policy_and_affinity_survive_exec(parent_state: None) -> None:
    script = (
        "from numarun.placement.binding import describe_self, get_mem_policy\n"
        "print(get_mem_policy())\n"
        "print(describe_self())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        preexec_fn=lambda: apply_in_child([ALLOWED[-1]], MemPolicy("bind", (0,))),
        capture_output=True,
        text=True,
        timeout=WAIT_LIMIT_S,
        check=True,
    )
    policy_line, description = result.stdout.splitlines()
    assert policy_line == "('bind', (0,))"
    assert description == (f"cpus={ALLOWED[-1]} mems_allowed={_mems_allowed_text()} policy=bind:0")


def test_apply_in_child_raises_oserror_for_a_node_the_cpuset_forbids() -> None:
    missing = max(int(n) for n in _mems_allowed_text().replace("-", ",").split(",")) + 1

    def child() -> None:
        apply_in_child(None, MemPolicy("bind", (missing,)))

    with pytest.raises(OSError) as raised:
        in_child(child)
    assert raised.value.errno == errno.EINVAL
    assert f"bind:{missing}" in str(raised.value)


def test_describe_self_of_a_default_process() -> None:
    assert describe_self() == (
        f"cpus={format_cpulist(ALLOWED)} mems_allowed={_mems_allowed_text()} policy=default"
    )


def test_nodemask_spans_words_and_pads_maxnode() -> None:
    mask, maxnode = binding._build_nodemask([0, 70])
    bits = binding._ULONG_BITS
    words = 70 // bits + 1
    assert len(mask) == words
    assert maxnode == words * bits + 1
    assert mask[0] & 1
    assert mask[70 // bits] >> (70 % bits) & 1
    assert sum(bin(word).count("1") for word in mask) == 2


@pytest.mark.parametrize(
    ("mode", "nodes", "name"),
    [
        (binding.MPOL_PREFERRED, (), "local"),
        (binding.MPOL_PREFERRED, (0,), "preferred"),
        (MPOL_BIND | 1 << 15, (0,), "bind"),
        (binding.MPOL_LOCAL, (), "local"),
        (MPOL_DEFAULT, (), "default"),
        (MPOL_PREFERRED_MANY, (0, 1), "preferred_many"),
        (99, (), "mode99"),
    ],
)
def test_policy_names_from_get_mempolicy(mode: int, nodes: tuple[int, ...], name: str) -> None:
    assert binding._policy_name(mode, nodes) == name


# --- check_mem_policy --------------------------------------------------------------------------


def test_check_passes_on_node_0_and_leaves_the_caller_at_default(parent_state: None) -> None:
    policies = [
        MemPolicy("bind", (0,)),
        None,
        MemPolicy("preferred", (0,)),
        MemPolicy("interleave", (0,)),
        MemPolicy("local", ()),
        MemPolicy("bind", (0,)),
    ]
    applied, warnings = check_mem_policy(policies, allow_fallback=False)
    assert applied == policies
    assert warnings == []
    assert get_mem_policy() == ("default", ())


def test_check_builds_node_masks_for_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    # apply_in_child only looks node masks up, so the parent must have built them.
    monkeypatch.setattr(binding, "_NODEMASKS", {})
    check_mem_policy(
        [MemPolicy("interleave", (0,))], allow_fallback=False, set_mempolicy=_refuse(set(), 0)
    )
    assert list(binding._NODEMASKS) == [(0,)]


def test_check_leaves_a_non_default_caller_policy_alone() -> None:
    def child() -> tuple[str, tuple[int, ...]]:
        apply_in_child(None, MemPolicy("preferred", (0,)))
        check_mem_policy([MemPolicy("bind", (0,)), MemPolicy("local", ())], allow_fallback=False)
        return get_mem_policy()

    assert in_child(child) == ("preferred", (0,))


def test_check_tries_policies_in_another_thread_and_resets_it() -> None:
    calls: list[tuple[int, tuple[int, ...], int]] = []

    def recording(mode: int, nodes: Any) -> int:
        calls.append((mode, tuple(nodes), threading.get_ident()))
        return 0

    check_mem_policy([MemPolicy("bind", (0,))], allow_fallback=False, set_mempolicy=recording)
    assert [(mode, nodes) for mode, nodes, _ in calls] == [(MPOL_BIND, (0,)), (MPOL_DEFAULT, ())]
    assert all(ident != threading.get_ident() for _, _, ident in calls)


def test_check_with_no_policies_does_nothing() -> None:
    def failing(mode: int, nodes: Any) -> int:
        raise AssertionError("no policy should be tried")

    assert check_mem_policy([None, None], allow_fallback=False, set_mempolicy=failing) == (
        [None, None],
        [],
    )


def test_absent_node_fails_with_one_line_naming_the_cpuset(parent_state: None) -> None:
    with pytest.raises(BindingError) as raised:
        check_mem_policy([MemPolicy("bind", (1,))], allow_fallback=False)
    message = str(raised.value)
    assert "\n" not in message
    assert message == (
        f"cannot bind memory to node 1: node 1 is not in Mems_allowed {_mems_allowed_text()} "
        "(cpuset); --mem-binding none works, or pass --binding-fallback"
    )


def test_multi_node_interleave_with_a_forbidden_node_is_refused(parent_state: None) -> None:
    # The kernel would silently drop node 1 from the mask; the check must not.
    with pytest.raises(BindingError, match="cannot interleave memory over nodes 0-1: node 1"):
        check_mem_policy([MemPolicy("interleave", (0, 1))], allow_fallback=False)


def test_absent_node_with_fallback_applies_no_policy_and_warns(parent_state: None) -> None:
    applied, warnings = check_mem_policy(
        [MemPolicy("bind", (1,)), MemPolicy("bind", (0,))], allow_fallback=True
    )
    assert applied == [None, MemPolicy("bind", (0,))]
    assert len(warnings) == 1
    assert warnings[0].startswith("local rank 0: cannot bind memory to node 1: node 1 is not in")
    assert warnings[0].endswith("applying none (the kernel default) instead")


def _refuse(refused: set[int], err: int) -> Callable[[int, Any], int]:
    def call(mode: int, nodes: Any) -> int:
        return err if mode in refused else 0

    return call


SECCOMP = "set_mempolicy is blocked (seccomp or missing CAP_SYS_NICE in a container)"


def test_simulated_eperm_names_seccomp(parent_state: None) -> None:
    everything = _refuse({1, 2, 3, 4, 5}, errno.EPERM)
    with pytest.raises(BindingError) as raised:
        check_mem_policy([MemPolicy("bind", (0,))], allow_fallback=False, set_mempolicy=everything)
    assert str(raised.value) == (
        f"cannot bind memory to node 0: {SECCOMP}; --mem-binding none works, "
        "or pass --binding-fallback"
    )


def test_simulated_eperm_with_fallback_steps_down_to_none(parent_state: None) -> None:
    everything = _refuse({1, 2, 3, 4, 5}, errno.EPERM)
    policies = [
        MemPolicy("interleave", (0,)),
        None,
        MemPolicy("interleave", (0,)),
        MemPolicy("preferred", (0,)),
    ]
    applied, warnings = check_mem_policy(policies, allow_fallback=True, set_mempolicy=everything)
    assert applied == [None, None, None, None]
    assert warnings == [
        f"local ranks 0,2: cannot interleave memory over node 0: {SECCOMP}; "
        "applying none (the kernel default) instead",
        f"local rank 3: cannot prefer memory on node 0: {SECCOMP}; "
        "applying none (the kernel default) instead",
    ]


def test_bind_refused_but_preferred_working_is_suggested(parent_state: None) -> None:
    bind_only = _refuse({MPOL_BIND}, errno.EINVAL)
    with pytest.raises(BindingError) as raised:
        check_mem_policy([MemPolicy("bind", (0,))], allow_fallback=False, set_mempolicy=bind_only)
    assert str(raised.value) == (
        "cannot bind memory to node 0: node 0 is not in this process's Mems_allowed (cpuset) "
        "or has no memory; --mem-binding preferred works, or pass --binding-fallback"
    )
    applied, warnings = check_mem_policy(
        [MemPolicy("bind", (0,))], allow_fallback=True, set_mempolicy=bind_only
    )
    assert applied == [MemPolicy("preferred", (0,))]
    assert warnings == [
        "local rank 0: cannot bind memory to node 0: node 0 is not in this process's "
        "Mems_allowed (cpuset) or has no memory; applying preferred:0 instead"
    ]


def test_enosys_says_the_kernel_lacks_numa(parent_state: None) -> None:
    with pytest.raises(BindingError, match="kernel built without NUMA support"):
        check_mem_policy(
            [MemPolicy("local", ())],
            allow_fallback=False,
            set_mempolicy=_refuse({4}, errno.ENOSYS),
        )


def test_node_without_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binding, "_mems_allowed", lambda: (0, 1))
    monkeypatch.setattr(binding, "_nodes_with_memory", lambda: (0,))
    with pytest.raises(BindingError, match="cannot prefer memory on node 1: node 1 has no memory"):
        check_mem_policy(
            [MemPolicy("preferred", (1,))], allow_fallback=False, set_mempolicy=_refuse(set(), 0)
        )


def test_multi_node_preferred_uses_preferred_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binding, "_mems_allowed", lambda: (0, 1))
    monkeypatch.setattr(binding, "_nodes_with_memory", lambda: (0, 1))
    modes: list[int] = []

    def recording(mode: int, nodes: Any) -> int:
        modes.append(mode)
        return 0

    policy = mem_policy_for("preferred", [0, 1])
    applied, warnings = check_mem_policy([policy], allow_fallback=False, set_mempolicy=recording)
    assert applied == [MemPolicy("preferred", (0, 1))]
    assert warnings == []
    assert modes[0] == MPOL_PREFERRED_MANY


def test_kernel_without_preferred_many_falls_back_to_the_first_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(binding, "_mems_allowed", lambda: (0, 1))
    monkeypatch.setattr(binding, "_nodes_with_memory", lambda: (0, 1))
    old_kernel = _refuse({MPOL_PREFERRED_MANY}, errno.EINVAL)
    applied, warnings = check_mem_policy(
        [MemPolicy("preferred", (1, 0))], allow_fallback=False, set_mempolicy=old_kernel
    )
    assert applied == [MemPolicy("preferred", (1,))]
    assert warnings == [
        "local rank 0: this kernel has no MPOL_PREFERRED_MANY (Linux < 5.15); "
        "using preferred:1 instead of preferred:0-1"
    ]


# --- mem_policy_for and MemPolicy --------------------------------------------------------------


def test_mem_policy_for_none_and_modes() -> None:
    assert mem_policy_for(None, [0]) is None
    assert mem_policy_for("none", [0]) is None
    assert mem_policy_for("local", [3, 4]) == MemPolicy("local", ())
    assert mem_policy_for("bind", [2, 1, 2]) == MemPolicy("bind", (2, 1))
    assert mem_policy_for("interleave", (0, 1)) == MemPolicy("interleave", (0, 1))
    assert mem_policy_for("preferred", [5]) == MemPolicy("preferred", (5,))


def test_mem_policy_for_unknown_mode_lists_the_modes() -> None:
    with pytest.raises(UsageError) as raised:
        mem_policy_for("membind", [0])
    assert str(raised.value) == (
        f"unknown --mem-binding 'membind'; choose one of {', '.join(MEM_MODES)}"
    )


def test_mem_policy_for_without_nodes_is_refused() -> None:
    with pytest.raises(UsageError, match="--mem-binding bind needs the rank's NUMA nodes"):
        mem_policy_for("bind", [])


@pytest.mark.parametrize(
    ("mode", "nodes", "complaint"),
    [
        ("none", (), "unknown memory policy 'none'"),
        ("bind", (-1,), "nodes are integers >= 0"),
        ("local", (0,), "takes no nodes"),
        ("interleave", (), "needs at least one NUMA node"),
    ],
)
def test_invalid_mem_policy_is_a_usage_error(
    mode: str, nodes: tuple[int, ...], complaint: str
) -> None:
    with pytest.raises(UsageError, match=complaint):
        MemPolicy(mode, nodes)


def test_mem_policy_nodes_become_a_tuple() -> None:
    policy = MemPolicy("bind", [0, 1])  # type: ignore[arg-type]
    assert policy.nodes == (0, 1)
    assert hash(policy) == hash(MemPolicy("bind", (0, 1)))


def test_mem_policy_text() -> None:
    assert str(MemPolicy("bind", (0, 1, 2))) == "bind:0-2"
    assert str(MemPolicy("local", ())) == "local"


# --- check_cpus --------------------------------------------------------------------------------


def test_check_cpus_accepts_allowed_cpus() -> None:
    check_cpus(ALLOWED)
    check_cpus(ALLOWED[:1], rank=0)


def test_check_cpus_names_cpus_outside_the_allowed_set() -> None:
    with pytest.raises(BindingError) as raised:
        check_cpus([ALLOWED[0], OUTSIDE_CPU], rank=3)
    assert str(raised.value) == (
        f"local rank 3: CPU {OUTSIDE_CPU} is outside this process's allowed CPUs "
        f"{format_cpulist(ALLOWED)}; the plan was made for another machine or container"
    )
    far = range(OUTSIDE_CPU + 6, OUTSIDE_CPU + 14)
    with pytest.raises(BindingError, match=f"^CPUs {format_cpulist(far)} are outside"):
        check_cpus(list(far))


def test_check_cpus_follows_a_narrowed_affinity() -> None:
    def child() -> None:
        os.sched_setaffinity(0, ALLOWED[:1])
        check_cpus(ALLOWED[:1])
        check_cpus(ALLOWED)

    if len(ALLOWED) < 2:
        pytest.fail("this test needs two allowed CPUs")
    with pytest.raises(BindingError, match=f"CPU {ALLOWED[1]} is outside"):
        in_child(child)


@pytest.mark.parametrize(("cpus", "complaint"), [([], "empty CPU list"), ([-1], ">= 0")])
def test_check_cpus_rejects_malformed_lists(cpus: list[int], complaint: str) -> None:
    with pytest.raises(BindingError, match=complaint):
        check_cpus(cpus)


# --- prctl -------------------------------------------------------------------------------------


def test_subreaper_round_trip() -> None:
    original = is_child_subreaper()
    try:
        assert set_child_subreaper(True) == original
        assert is_child_subreaper() is True
        assert set_child_subreaper(False) is True
        assert is_child_subreaper() is False
    finally:
        set_child_subreaper(original)
    assert is_child_subreaper() == original


def test_parent_death_signal_round_trip_in_child() -> None:
    def child() -> tuple[int, int]:
        before = get_parent_death_signal()
        set_parent_death_signal(signal.SIGTERM)
        return before, get_parent_death_signal()

    assert in_child(child) == (0, signal.SIGTERM)


def test_parent_death_signal_fires_at_once_when_the_parent_is_already_gone() -> None:
    def child() -> None:
        set_parent_death_signal(signal.SIGTERM, expected_parent=os.getppid() + 999_999)
        time.sleep(WAIT_LIMIT_S)

    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    status = _wait_bounded(pid)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGTERM


def _orphan_grandchild(death_signal: int | None) -> tuple[int, int]:
    """Fork an intermediate process that forks a sleeping grandchild; return both pids.

    The grandchild sets ``death_signal`` (unless None) before it reports ready.
    """
    read_end, write_end = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        try:
            os.close(read_end)
            parent = os.getpid()
            grandchild = os.fork()
            if grandchild == 0:
                try:
                    if death_signal is not None:
                        set_parent_death_signal(death_signal, expected_parent=parent)
                    os.write(write_end, f"{os.getpid()}\n".encode())
                    time.sleep(WAIT_LIMIT_S * 3)
                finally:
                    os._exit(0)
            time.sleep(WAIT_LIMIT_S * 3)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as source:
        grandchild_pid = int(source.readline())
    return intermediate, grandchild_pid


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        # The command name may contain spaces; fields after the last ')' are fixed.
        return int(stat.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("death_signal", [signal.SIGKILL, None])
def test_grandchild_dies_with_its_parent_only_when_asked(death_signal: int | None) -> None:
    original = set_child_subreaper(True)
    try:
        intermediate, grandchild = _orphan_grandchild(death_signal)
        assert _parent_of(grandchild) == intermediate
        os.kill(intermediate, signal.SIGKILL)
        assert os.WTERMSIG(_wait_bounded(intermediate)) == signal.SIGKILL
        if death_signal is None:
            # Without the death signal the orphan lives on, reparented to us (the subreaper).
            deadline = time.monotonic() + WAIT_LIMIT_S
            while _parent_of(grandchild) != os.getpid() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _parent_of(grandchild) == os.getpid()
            assert os.waitpid(grandchild, os.WNOHANG) == (0, 0)
            os.kill(grandchild, signal.SIGKILL)
        status = _wait_bounded(grandchild)
        assert os.WIFSIGNALED(status)
        assert os.WTERMSIG(status) == signal.SIGKILL
    finally:
        set_child_subreaper(original)


def test_invalid_parent_death_signal_is_an_oserror() -> None:
    def child() -> None:
        set_parent_death_signal(1000)

    with pytest.raises(OSError) as raised:
        in_child(child)
    assert raised.value.errno == errno.EINVAL


def test_unknown_architecture_makes_memory_policy_unsupported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(binding, "_MEMPOLICY_SUPPORTED", False)
    with pytest.raises(BindingError, match="not supported on this architecture"):
        check_mem_policy([MemPolicy("local", ())], allow_fallback=False)
    applied, warnings = check_mem_policy([MemPolicy("bind", (0,))], allow_fallback=True)
    assert applied == [None]
    assert "not supported on this architecture" in warnings[0]
    with pytest.raises(BindingError, match="not supported on this architecture"):
        get_mem_policy()
    assert describe_self().endswith(" policy=unknown")
