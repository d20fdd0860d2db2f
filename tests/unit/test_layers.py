"""The import rules of docs/architecture.md hold: every import-linter contract in pyproject.toml
(layers cli > runtime > controller > engines | measurement | kube > api; the operator below the CLI
imports only lookahead_canary's shared modules; no runtime package imports lookahead_dev, rich or
matplotlib; the engine server never imports the operator; measurement.stats is numpy only).

A broken contract fails this test with import-linter's report: which module imports which, and
the chain of imports that leads there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_every_import_contract_is_kept():
    run = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                          "lint_imports_command()", "--no-cache"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    report = run.stdout + run.stderr
    if run.returncode != 0:
        pytest.fail(f"an import contract is broken (`lint-imports` in {REPO}):\n{report}", pytrace=False)
    assert "0 broken" in report, report


def test_every_package_directory_is_in_the_wheel():
    """pyproject.toml names each package (package-dir maps operator/ to lookahead_operator, which
    setuptools' discovery cannot do): a subpackage left off that list is missing from the wheel, and
    so from the operator and engine images, though every test on the editable install passes."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, directory in config["package-dir"].items():
        for init in (REPO / directory).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / directory)
            found.add(".".join((name, *rel.parts)))
    assert found - listed == set(), f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed in pyproject.toml but no such package: {sorted(listed - found)}"
