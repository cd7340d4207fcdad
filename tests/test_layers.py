"""The layers of DESIGN.md §1, enforced: `lint-imports` with the contracts in pyproject.toml,
mypy over every product package, and the PySide6 workaround wherever Qt is used.

The tools run exactly as a developer runs them, from the repository root after the README's
install commands: the folders parsers/, classifiers/, viewer/ and assets/ install under
`vramscope` (pyproject.toml's package-dir), and the links vramscope/parsers -> ../parsers
(and the others) show them there to every tool that reads the disk.
"""
from __future__ import annotations

import os
import re
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
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lint_imports() -> str:
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    return exe


def test_every_installed_folder_is_linked_under_vramscope():
    """What installs under `vramscope` from another folder is there on disk too (a link), so
    mypy, import-linter and an editor find `vramscope.viewer` from a fresh checkout."""
    for pkg, src in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        if pkg == "vramscope":
            continue
        link = ROOT / pkg.replace(".", "/")
        assert link.is_dir() and link.resolve() == (ROOT / src).resolve(), \
            f"{link.relative_to(ROOT)} should be a link to ../{src} (git clone -c core.symlinks=true on Windows)"


def test_import_contracts_hold():
    """`lint-imports` from the repository root, as a developer runs it."""
    r = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    n = len(PYPROJECT["tool"]["importlinter"]["contracts"])
    assert f"Contracts: {n} kept, 0 broken" in r.stdout, r.stdout[-2000:]


def test_a_broken_layer_is_caught(tmp_path):
    """The contract can fail: a classifier importing the services and Qt breaks it (in a copy
    of the package, links followed)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "vramscope", src / "vramscope",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pickle", "icons"))
    (src / "vramscope" / "classifiers" / "upward.py").write_text("from ..services import summary  # noqa\n"
                                                                   "import PySide6  # noqa\n")
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = subprocess.run([_lint_imports(), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=src, env=env,
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


def _mypy(tmp_path, config: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
                           str(tmp_path / "mypy-cache")], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_every_product_package_type_checks(tmp_path):
    """`mypy` from the repository root (pyproject.toml: every package under `vramscope`, the
    override list aside) finds nothing."""
    r = _mypy(tmp_path, ROOT / "pyproject.toml")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"Success: no issues found in \d+ source files", r.stdout), r.stdout[-2000:]


def test_no_module_is_excused_from_type_checking():
    """The list of modules whose mypy errors are ignored is empty, and stays so: a module that
    does not type-check fails the test above instead of going on a list."""
    excused = [o["module"] for o in PYPROJECT["tool"]["mypy"].get("overrides", []) if o.get("ignore_errors")]
    assert not excused, f"modules excused from mypy: {excused}"
