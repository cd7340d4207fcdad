#!/usr/bin/env bash
# Build the one-folder PyInstaller bundle: dist/vramscope/vramscope
#   packaging/build_bundle.sh            build
#   packaging/build_bundle.sh --check    build, then check that the bundle's
#       `view --screenshot` is pixel-identical to the installed wheel's
# Steps: build the wheel, install it (not the editable checkout) into
# build/bundle-venv (created with --system-site-packages so already-installed
# numpy/PySide6/pyqtgraph are reused; pip fetches whatever is missing), install
# PyInstaller there if needed, run packaging/vramscope.spec, smoke-test.
# PYTHON selects the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=build/bundle-venv

rm -rf build/bundle-wheel
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w build/bundle-wheel . \
  || "$PY" -m pip wheel -q --no-deps -w build/bundle-wheel .
WHEEL=$(ls build/bundle-wheel/vramscope-*.whl)

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL"   # missing dependencies only
"$VENV/bin/python" -c "import PyInstaller" 2>/dev/null \
  || "$VENV/bin/python" -m pip install -q --disable-pip-version-check pyinstaller

# run from outside the checkout so `import vramscope` resolves to the wheel's copy
ROOT="$PWD"
mkdir -p build/pyinstaller
cd build/pyinstaller
"$ROOT/$VENV/bin/python" - <<'PYCHECK'
import os, sys, vramscope
here = os.path.realpath(vramscope.__file__)
if not here.startswith(os.path.realpath(sys.prefix)):
    sys.exit(f"build_bundle: vramscope resolves to {here}, not the build venv")
PYCHECK

"$ROOT/$VENV/bin/python" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath "$ROOT/dist" --workpath "$ROOT/build/pyinstaller" "$ROOT/packaging/vramscope.spec"
cd "$ROOT"

# smoke test: the CLI answers and the bundled example opens
dist/vramscope/vramscope --version
dist/vramscope/vramscope summary "$(find dist/vramscope -name example.pickle | head -1)" --no-cache >/dev/null
echo "bundle: dist/vramscope/ ($(du -sh dist/vramscope | cut -f1))"

if [[ "${1:-}" == "--check" ]]; then
    export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}" VRAMSCOPE_CACHE_DIR=""
    SHOTS=build/bundle-check
    mkdir -p "$SHOTS"
    # the installed app is the same wheel the bundle was built from (build venv)
    (cd "$SHOTS" && "$ROOT/$VENV/bin/vramscope" view "$ROOT/assets/example.pickle" --screenshot installed.png)
    dist/vramscope/vramscope view assets/example.pickle --screenshot "$SHOTS/bundle.png"
    "$VENV/bin/python" packaging/compare_png.py "$SHOTS/installed.png" "$SHOTS/bundle.png"
fi
