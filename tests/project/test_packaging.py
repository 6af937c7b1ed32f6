"""What a user installing numarun gets besides the code: licence, type information, metadata.

``pip install numarun`` must say what it is (classifiers, project URLs), under which licence
(BSD-3-Clause, as PyTorch), that it is typed (``py.typed``, PEP 561), and offer the c10d path's
dependency as an extra (``pip install 'numarun[torch]'``) while the tests stay pinned to the
torch they run against.
"""

from __future__ import annotations

import ast
import re
from importlib import metadata
from pathlib import Path

import pytest

import numarun

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the metadata checks below need none


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_licence_is_bsd_3_clause_as_pytorch_and_ships_with_the_package() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Neither the name of the copyright holder" in text  # the third clause
    project = _project()
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]


def test_the_package_is_typed() -> None:
    assert (Path(numarun.__file__).parent / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["numarun"]
    assert "Typing :: Typed" in _project()["classifiers"]


def test_classifiers_and_urls_say_what_it_is() -> None:
    project = _project()
    classifiers = project["classifiers"]
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in classifiers)
    assert not [c for c in classifiers if c.startswith("License ::")]  # SPDX says it (PEP 639)
    urls = project["urls"]
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())


def test_a_torch_extra_for_the_c10d_path_and_the_tests_stay_pinned() -> None:
    extras = _project()["optional-dependencies"]
    assert [re.split(r"[<>=!~ ]", spec)[0] for spec in extras["torch"]] == ["torch"]
    assert "torch==2.13.0" in extras["test"]
    assert _project()["dependencies"] == []  # the static path needs nothing


def test_the_installed_metadata_carries_it() -> None:
    meta = metadata.metadata("numarun")
    assert "torch" in (meta.get_all("Provides-Extra") or [])
    assert any("Typing :: Typed" in c for c in meta.get_all("Classifier") or [])
    assert meta.get_all("Project-URL")
    assert (meta.get("License-Expression") or meta.get("License")) == "BSD-3-Clause"


def test_the_changelog_names_this_release() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(numarun.__version__)}\]?", text, re.MULTILINE)


def test_the_numarun_command_is_a_script_that_imports_only_numarun() -> None:
    """Not a [project.scripts] entry point: the wrapper installers generate for one imports
    re first, about 4 ms of every launch (issue 32 item 13). The script, installed with its
    first line pointed at the environment's python, imports numarun.cli and nothing else."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "scripts" not in config["project"]
    assert config["tool"]["setuptools"]["script-files"] == ["scripts/numarun"]
    text = (ROOT / "scripts" / "numarun").read_text()
    assert text.startswith("#!python\n")
    imports = [
        (node.module, [alias.name for alias in node.names])
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert imports == [("numarun.cli", ["main"])]

