"""The layout is the architecture: wings by concern, imports in one direction, rooms of one sitting.

Every import between numarun's modules is counted: at module level, inside functions, under
``TYPE_CHECKING``, and ``importlib.import_module("numarun...")`` with a literal name. DESIGN.md
draws the same map.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "numarun"

# What each wing may import besides itself, lowest first. ``base`` is imported by everyone.
BASE = {"numarun.errors", "numarun._version"}
WINGS = ["worker", "machine", "placement", "process", "stacks", "spawning", "cmdline", "files",
         "rendezvous", "jobwide", "launch", "check"]
_LOW = {"machine", "placement", "process", "stacks", "worker"}
MAY_IMPORT = {
    "worker": set(),
    "machine": set(),
    "placement": {"machine"},
    "process": {"placement", "machine"},
    "stacks": {"process", "placement", "machine", "worker"},
    "spawning": {"stacks", "process", "placement", "machine", "worker"},
    "cmdline": {"stacks", "process", "placement", "machine"},
    "files": {"cmdline"},
    "rendezvous": {"cmdline"} | _LOW,
    "jobwide": {"rendezvous", "cmdline"} | _LOW,
    "launch": {"jobwide", "rendezvous", "files", "cmdline"} | _LOW,
    "check": {"launch", "jobwide", "rendezvous", "files", "cmdline"} | _LOW,
}
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 500
MAX_FUNCTION_LINES = 100
# Wings whose every function is held to MAX_FUNCTION_LINES (issue 26; the others join as they
# are split).
def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The numarun module that importing ``name`` loads last (a submodule, else its package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> Iterator[tuple[int, str]]:
    """(line, imported numarun module) for every import in ``module``, wherever it is."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "numarun":
                    target = resolve(alias.name)
                    if target:
                        yield node.lineno, target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "numarun":
                continue
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}")
                if target:
                    yield node.lineno, target
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("numarun")
        ):
            target = resolve(node.args[0].value)
            if target:
                yield node.lineno, target


GRAPH = {
    module: {target for _, target in imports_of(module) if target != module} for module in MODULES
}


def wing_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else module


def test_there_are_wings_each_saying_what_it_holds_and_may_import() -> None:
    for wing in WINGS:
        init = PACKAGE / wing / "__init__.py"
        tree = ast.parse(init.read_text())
        doc = ast.get_docstring(tree)
        assert doc and "May import" in doc, f"{init}: say what the wing holds and may import"
        # A wing's __init__ imports nothing, so that loading one module of it loads only that.
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_every_module_says_what_it_is() -> None:
    missing = [m for m, p in MODULES.items() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == [], "modules without a docstring"


def test_each_room_has_a_name_of_its_own() -> None:
    # A name says what the room holds: no two modules share a file name, or differ only by a
    # trailing "s" (spec/specs, worker/workers), whichever wing they are in.
    seen: dict[str, str] = {}
    clashes = []
    for module in MODULES:
        name = module.rpartition(".")[2]
        if name == "numarun" or MODULES[module].name == "__init__.py":
            continue
        key = name.removesuffix("s")
        if key in seen:
            clashes.append(f"{seen[key]} and {module}")
        seen[key] = module
    assert clashes == []


def test_imports_follow_the_wings() -> None:
    wrong = []
    for module in MODULES:
        wing = wing_of(module)
        if wing not in MAY_IMPORT:
            continue
        for line, target in imports_of(module):
            target_wing = wing_of(target)
            if target in BASE or target_wing == wing or target_wing in MAY_IMPORT[wing]:
                continue
            wrong.append(f"{MODULES[module].relative_to(PACKAGE)}:{line} imports {target}")
    assert wrong == []


def test_base_modules_import_nothing_of_numarun() -> None:
    assert {m: GRAPH[m] for m in BASE if GRAPH[m]} == {}


def test_no_import_circle() -> None:
    # Tarjan's strongly connected components over every import counted.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert circles == []


def test_the_checks_above_can_fail() -> None:
    # The resolver sees through every form of import the checks rely on.
    source = (
        "import numarun.process.supervisor\n"
        "from numarun.stacks import channel\n"
        "def f():\n    from numarun.cmdline.config import LaunchConfig\n"
        "if TYPE_CHECKING:\n    from numarun.spawning.api import spawn\n"
        "importlib.import_module('numarun.machine.nvml')\n"
    )
    probe = PACKAGE / "placement" / "_probe_for_test.py"
    probe.write_text(source)
    try:
        MODULES["numarun.placement._probe_for_test"] = probe
        found = {target for _, target in imports_of("numarun.placement._probe_for_test")}
    finally:
        del MODULES["numarun.placement._probe_for_test"]
        probe.unlink()
    assert found == {
        "numarun.process.supervisor",
        "numarun.stacks.channel",
        "numarun.cmdline.config",
        "numarun.spawning.api",
        "numarun.machine.nvml",
    }


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_room_is_one_sitting(module: str) -> None:
    path = MODULES[module]
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path} has {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            assert size <= MAX_CLASS_LINES, f"{path}: class {node.name} has {size} lines"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_is_over_a_hundred_lines(module: str) -> None:
    path = MODULES[module]
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"  # type: ignore[operator]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES  # type: ignore[operator]
    ]
    assert long == [], f"{path}: split them"


def test_public_api() -> None:
    code = (
        "import numarun, sys\n"
        "names = ['spawn', 'start_processes', 'ProcessContext', 'SpawnContext',\n"
        "         'ProcessException', 'ProcessRaisedException', 'ProcessExitedException']\n"
        "before = 'numarun.spawning.api' in sys.modules\n"
        "values = [getattr(numarun, n) for n in names]\n"
        "assert numarun.SpawnContext is numarun.ProcessContext\n"
        "assert callable(numarun.spawn) and callable(numarun.start_processes)\n"
        "assert all(n in numarun.__all__ for n in names)\n"
        "print(before, numarun.__version__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lazy, version = done.stdout.split()
    assert lazy == "False" and version.count(".") >= 1


# --- issue 33: wings a newcomer can hold in their head ----------------------------------------

MAX_WING_SHARE = 0.20  # of the package's lines
MAX_WING_MODULES = 16


def test_no_wing_outgrows_the_picture() -> None:
    lines = {module: MODULES[module].read_text().count("\n") for module in MODULES}
    total = sum(lines.values())
    too_big = []
    for wing in WINGS:
        members = [m for m in MODULES if wing_of(m) == wing]
        share = sum(lines[m] for m in members) / total
        if share > MAX_WING_SHARE or len(members) > MAX_WING_MODULES:
            too_big.append(f"{wing}: {len(members)} modules, {share:.0%} of the lines")
    assert too_big == []


def _classes() -> Iterator[tuple[str, ast.ClassDef]]:
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield module, node


def test_every_class_has_a_name_of_its_own() -> None:
    seen: dict[str, str] = {}
    clashes = []
    for module, node in _classes():
        if node.name in seen:
            clashes.append(f"{node.name}: {seen[node.name]} and {module}")
        seen.setdefault(node.name, module)
    assert clashes == []


def numarun_bases(node: ast.ClassDef, ours: set[str]) -> list[str]:
    """The bases of ``node`` that are numarun classes (named bare or as ``module.Name``)."""
    names = [base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
             for base in node.bases]  # fmt: skip
    return [name for name in names if name in ours]


def test_no_class_is_assembled_from_numarun_classes() -> None:
    # Composition, not mixins: a class has at most one numarun class among its bases.
    ours = {node.name for _, node in _classes()}
    mixed = [f"{module}.{node.name}" for module, node in _classes()
             if len(numarun_bases(node, ours)) > 1]  # fmt: skip
    assert mixed == []


def test_the_class_checks_above_can_fail() -> None:
    tree = ast.parse("class A(B, jobwide.C, Exception): pass\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    assert numarun_bases(node, {"B", "C", "A"}) == ["B", "C"]
