"""The layers of DESIGN.md §1, enforced: `lint-imports` with the contracts in pyproject.toml,
and the PySide6 workaround wherever Qt is used.

The repository keeps each package in its own top-level folder and setuptools maps them
under `vramscope` (package-dir); import-linter reads packages from disk, so the test
lays the sources out as they are installed (a copy in a temporary folder) and runs
`lint-imports` on that.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def installed_layout(dest: Path) -> Path:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for pkg, src in sorted(conf["package-dir"].items()):
        shutil.copytree(ROOT / src, dest / pkg.replace(".", "/"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pickle", "icons"))
    return dest


def test_import_contracts_hold(tmp_path):
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    src = installed_layout(tmp_path / "src")
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=src, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken" in r.stdout, r.stdout[-2000:]


def test_a_broken_layer_is_caught(tmp_path):
    """The contract can fail: a classifier importing the viewer breaks it."""
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed")
    src = installed_layout(tmp_path / "src")
    (src / "vramscope" / "classifiers" / "upward.py").write_text("from ..services import summary  # noqa\n"
                                                                   "import PySide6  # noqa\n")
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=src, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "vramscope.classifiers.upward -> vramscope.services.summary" in r.stdout
    assert "vramscope.classifiers.upward -> PySide6" in r.stdout


def test_report_png_fifty_times_without_the_viewer_imported_first(tmp_path):
    """The report's PNG is drawn by viewer code, so the PySide6 workaround (viewer/qt.py)
    is in place however the report is made: 50 renders in a fresh process that imports
    only the services and the renderer (it aborted on the 11th before the workaround was
    applied everywhere Qt is imported)."""
    code = (
        "import os, sys\n"
        "os.environ['QT_QPA_PLATFORM'] = 'offscreen'\n"
        "os.environ['VRAMSCOPE_CACHE_DIR'] = ''\n"
        "from vramscope.parsers import open_snapshot\n"
        "from vramscope.classifiers import analyze\n"
        "from vramscope.viewer.report_png import render_timeline\n"
        "an = analyze(open_snapshot(sys.argv[1], use_cache=False))\n"
        "for k in range(50):\n"
        "    render_timeline(an, 0, os.path.join(sys.argv[2], f't{k % 3}.png'))\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "assets" / "example.pickle"), str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_typed_packages_type_check(tmp_path):
    """mypy over the analysis (typed results, query API), the presentation layer, the
    services and the command line, with pyproject.toml's [tool.mypy] settings."""
    pytest.importorskip("mypy")
    src = installed_layout(tmp_path / "src")
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                        "-p", "vramscope.classifiers", "-p", "vramscope.present", "-p", "vramscope.common",
                        "-p", "vramscope.services", "-p", "vramscope.cli"],
                       cwd=src, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
