"""Issue 6: the built wheel (and sdist) carry the right files, and the wheel
installs into a fresh virtual environment where `vramscope summary` runs.

The wheel is built from a copy of the checkout (so the test never writes
build/ or *.egg-info into the working tree), with no build isolation when the
declared build backend (setuptools>=77) is importable here (fast, offline),
else with a current setuptools that pip fetches into a private folder. The fresh venv reuses the already
installed dependencies through a .pth file (so PySide6 is not downloaded
again), but the wheel itself is installed with --no-deps --no-index and the
test checks that the venv's own copy of vramscope is what runs.

Set VRAMSCOPE_SKIP_PACKAGING=1 to skip (it takes ~15-30 s).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    os.environ.get("VRAMSCOPE_SKIP_PACKAGING", "") not in ("", "0"),
    reason="VRAMSCOPE_SKIP_PACKAGING is set",
)

ICON_SIZES = (16, 32, 48, 64, 128, 256, 512)
REQUIRED_IN_WHEEL = [
    "vramscope/__init__.py",
    "vramscope/__main__.py",
    "vramscope/py.typed",              # PEP 561: type checkers read vramscope's own annotations
    "vramscope/cli/__init__.py",
    "vramscope/cli/summary.py",
    "vramscope/common/units.py",
    "vramscope/present/stacks.py",
    "vramscope/services/report.py",
    "vramscope/parsers/__init__.py",
    "vramscope/parsers/reader.py",
    "vramscope/classifiers/__init__.py",
    "vramscope/viewer/__init__.py",
    "vramscope/assets/__init__.py",
    "vramscope/assets/example.pickle",
    "vramscope/assets/vramscope.desktop",
    "vramscope/assets/vramscope-mime.xml",
    "vramscope/assets/io.github.vramscope.metainfo.xml",
    "vramscope/assets/icons/vramscope.svg",
] + [f"vramscope/assets/icons/hicolor/{n}x{n}/apps/vramscope.png" for n in ICON_SIZES]

_COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "venv", ".ci", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
    ".pytest_cache", ".hypothesis", ".benchmarks", "out",
)


def _backend_here() -> bool:
    """True when setuptools (as pyproject's build-system asks, >=77: SPDX `license`) can build a wheel here."""
    try:
        import setuptools
    except ImportError:
        return False
    ver = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    return ver >= (77, 0)


def _run(cmd, cwd, timeout=300, env=None):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel path, sdist path) built from a scratch copy of the checkout."""
    base = tmp_path_factory.mktemp("pkg")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=_COPY_IGNORE, symlinks=True)
    out = base / "dist"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if not _backend_here():
        # this interpreter's setuptools is older than pyproject asks: fetch a
        # current one into a private folder (what an isolated build would do)
        backend = base / "backend"
        _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", backend,
              "setuptools>=77"], cwd=base)
        env["PYTHONPATH"] = str(backend)
    for hook in ("build_wheel", "build_sdist"):  # one process each: the hooks keep global state
        code = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
        _run([sys.executable, "-c", code, out], cwd=src, env=env)
    sdist = next(out.glob("vramscope-*.tar.gz"))
    wheel = next(out.glob("vramscope-*.whl"))
    return wheel, sdist


def test_wheel_contents(built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        example = z.getinfo("vramscope/assets/example.pickle")
        icon_png = z.read("vramscope/assets/icons/hicolor/256x256/apps/vramscope.png")
    missing = [n for n in REQUIRED_IN_WHEEL if n not in names]
    assert not missing, f"missing from the wheel: {missing}"

    # the classifier rules file (whatever data file the classifiers ship)
    rules = [n for n in names if re.fullmatch(r"vramscope/classifiers/[^/]+\.(json|toml)", n)]
    assert rules, "no classifier rules file (*.json / *.toml) in vramscope/classifiers/"

    # only the vramscope package and its metadata; no tests, data, benchmarks or shared files
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"vramscope", "vramscope-0.1.0.dist-info".replace("0.1.0", wheel.name.split("-")[1])}, tops
    bad = [n for n in names if re.search(r"(^|/)(tests?|groundtruth|benchmarks|shared|\.ci)(/|$)", n)
           or n.endswith(("DESIGN.md", "conftest.py")) or "/test_" in n or "/__pycache__/" in n]
    assert not bad, f"must not ship: {bad}"
    pickles = [n for n in names if n.endswith(".pickle")]
    assert pickles == ["vramscope/assets/example.pickle"], pickles
    assert 100_000 < example.file_size < 5_000_000
    assert icon_png.startswith(b"\x89PNG")

    # metadata: console script, declared dependencies only, torch optional
    # the command goes through vramscope.__main__:entry, which calls run (Ctrl-C while importing
    # is one line, exit 130) and ends the process without the teardown
    assert re.search(r"^vramscope\s*=\s*vramscope\.__main__:entry", entry_points, re.M)
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    hard = [r for r in requires if "extra ==" not in r]
    assert not [r for r in hard if r.lower().startswith("torch")], hard
    for dep in ("numpy", "orjson", "platformdirs", "pyside6", "pyqtgraph"):
        assert any(r.lower().startswith(dep) for r in hard), (dep, hard)
    # an SPDX licence expression and the licence text
    assert re.search(r"^License-Expression: BSD-3-Clause$", meta, re.M), meta[:800]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # a pure-Python wheel
    assert wheel.name.endswith("-py3-none-any.whl")


def test_sdist_contents(built):
    _, sdist = built
    with tarfile.open(sdist) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    for need in ("pyproject.toml", "README.md", "parsers/reader.py", "classifiers/__init__.py",
                 "viewer/__init__.py", "vramscope/cli/__init__.py", "assets/example.pickle",
                 "assets/icons/vramscope.svg", "packaging/vramscope.spec", "packaging/launcher.py",
                 "packaging/build_bundle.sh", "packaging/make_icons.py"):
        assert need in names, f"{need} missing from the sdist"
    bad = [n for n in names if n.startswith(("tests/", "benchmarks/", ".ci/", "build/", "dist/"))
           or "__pycache__" in n]
    assert not bad, bad
    # the links vramscope/parsers -> ../parsers (and the others) are for tools in a checkout:
    # the sdist holds each folder once, where package-dir takes it from
    links = [n for n in names if n.startswith(("vramscope/parsers", "vramscope/classifiers", "vramscope/viewer",
                                                "vramscope/assets"))]
    assert not links, links


def _site_packages_of(venv: Path) -> Path:
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    return Path(purelib)


def _dependency_dirs():
    """Where this interpreter finds the runtime dependencies (so the venv need not download them)."""
    dirs = []
    for mod in ("numpy", "orjson", "platformdirs", "PySide6", "shiboken6", "pyqtgraph"):
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.origin:
            continue
        d = str(Path(spec.origin).resolve().parent.parent)
        if d not in dirs:
            dirs.append(d)
    return dirs


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory):
    """A fresh venv with the wheel installed (--no-deps); dependencies reached through a .pth."""
    wheel, _ = built
    base = tmp_path_factory.mktemp("venv")
    env_dir = base / "env"
    _run([sys.executable, "-m", "venv", env_dir], cwd=base, timeout=120)
    py = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = _site_packages_of(env_dir)
    assert site.is_dir(), site
    # appended after the venv's own site-packages, so the wheel's copy wins over
    # any editable install of vramscope living next to the dependencies
    (site / "_vramscope_test_deps.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check", wheel],
         cwd=base, timeout=180)
    exe = env_dir / ("Scripts/vramscope.exe" if os.name == "nt" else "bin/vramscope")
    assert exe.exists(), "the console script was not installed"
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run_env["QT_QPA_PLATFORM"] = "offscreen"
    run_env["VRAMSCOPE_CACHE_DIR"] = str(base / "cache")
    return {"dir": env_dir, "python": py, "exe": exe, "cwd": base, "env": run_env}


def test_wheel_installs_and_runs_summary(venv):
    probe = (
        "import vramscope, vramscope.parsers, vramscope.classifiers, vramscope.assets; "
        "from importlib.resources import files; "
        "print(vramscope.__file__); print(vramscope.parsers.__file__); "
        "print(files('vramscope.assets').joinpath('example.pickle'))"
    )
    r = _run([venv["python"], "-c", probe], cwd=venv["cwd"], env=venv["env"])
    paths = [Path(p).resolve() for p in r.stdout.split()]
    root = venv["dir"].resolve()
    for p in paths:
        assert root in p.parents, f"{p} is not the wheel's copy inside {root}"
    installed_example = paths[2]
    assert installed_example.is_file()

    for snapshot in (ROOT / "assets" / "example.pickle", installed_example):
        r = subprocess.run([str(venv["exe"]), "summary", str(snapshot)], cwd=venv["cwd"], env=venv["env"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "peak" in r.stdout
    r = subprocess.run([str(venv["exe"]), "summary", str(installed_example), "--json"], cwd=venv["cwd"],
                       env=venv["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.lstrip().startswith("{") and '"devices"' in r.stdout


def test_wheel_viewer_screenshot(venv, built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        if "vramscope/viewer/app.py" not in z.namelist():
            pytest.skip("the viewer (vramscope/viewer/app.py) is not in this build yet")
    out = venv["cwd"] / "shot.png"
    r = subprocess.run([str(venv["exe"]), "view", str(ROOT / "assets" / "example.pickle"), "--screenshot", str(out)],
                       cwd=venv["cwd"], env=venv["env"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
