"""The repository's own checks can fail: tools/check_imports.py (run by .ci/run before the
tests) reports an import cycle and an import against the layering, on a copy of the package
with exactly those defects added."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_imports.py"


def _check(root: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--root", str(root)],
                          capture_output=True, text=True, timeout=120)


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    shutil.copytree(ROOT / "flightsrv", tmp_path / "flightsrv",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


def _append(path: pathlib.Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_package_as_it_is_passes(tmp_path):
    got = _check(_copy(tmp_path))
    assert got.returncode == 0, got.stdout
    assert "0 problem(s)" in got.stdout


def test_a_cycle_fails_naming_its_modules(tmp_path):
    root = _copy(tmp_path)
    # deletes already imports datafile; datafile importing deletes closes a cycle (same layer)
    _append(root / "flightsrv/table/datafile.py", "from flightsrv.table import deletes  # noqa")
    got = _check(root)
    assert got.returncode == 1
    cycles = [ln for ln in got.stdout.splitlines() if ln.startswith("cycle:")]
    assert cycles and "flightsrv.table.datafile" in cycles[0] \
        and "flightsrv.table.deletes" in cycles[0]


def test_an_upward_import_fails_naming_both_layers(tmp_path):
    root = _copy(tmp_path)
    _append(root / "flightsrv/store/local.py",
            "def _late():\n    from flightsrv.engine import guard  # noqa")
    got = _check(root)
    assert got.returncode == 1
    assert "layering: flightsrv.store.local (layer 1) imports flightsrv.engine.guard (layer 4)" \
        in got.stdout


def test_type_checking_imports_are_not_dependencies(tmp_path):
    root = _copy(tmp_path)
    _append(root / "flightsrv/store/local.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from flightsrv.engine import guard  # noqa")
    got = _check(root)
    assert got.returncode == 0, got.stdout
