#!/usr/bin/env bash
# Register vramscope with the Linux desktop for the current user: menu entry,
# icons, the application/x-vramscope-snapshot MIME type (*.pickle, weak) and
# AppStream metadata. Needs `vramscope` on PATH (pip install, or the bundle's
# dist/vramscope/ folder on PATH). PREFIX defaults to ~/.local/share.
#   packaging/install_desktop.sh            install
#   packaging/install_desktop.sh --remove   undo
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${PREFIX:-${XDG_DATA_HOME:-$HOME/.local/share}}"
SIZES="16 32 48 64 128 256 512"

if [[ "${1:-}" == "--remove" ]]; then
    rm -f "$PREFIX/applications/vramscope.desktop" "$PREFIX/mime/packages/vramscope-mime.xml" \
          "$PREFIX/metainfo/io.github.vramscope.metainfo.xml" "$PREFIX/icons/hicolor/scalable/apps/vramscope.svg"
    for n in $SIZES; do rm -f "$PREFIX/icons/hicolor/${n}x${n}/apps/vramscope.png"; done
else
    install -Dm644 assets/vramscope.desktop "$PREFIX/applications/vramscope.desktop"
    install -Dm644 assets/vramscope-mime.xml "$PREFIX/mime/packages/vramscope-mime.xml"
    install -Dm644 assets/io.github.vramscope.metainfo.xml "$PREFIX/metainfo/io.github.vramscope.metainfo.xml"
    install -Dm644 assets/icons/vramscope.svg "$PREFIX/icons/hicolor/scalable/apps/vramscope.svg"
    for n in $SIZES; do
        install -Dm644 "assets/icons/hicolor/${n}x${n}/apps/vramscope.png" "$PREFIX/icons/hicolor/${n}x${n}/apps/vramscope.png"
    done
    command -v vramscope >/dev/null || echo "note: vramscope is not on PATH; the menu entry runs 'vramscope %f'" >&2
fi
# refresh the caches where the tools exist (all optional)
command -v update-mime-database >/dev/null && update-mime-database "$PREFIX/mime" || true
command -v update-desktop-database >/dev/null && update-desktop-database "$PREFIX/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$PREFIX/icons/hicolor" || true
echo "done (${1:-install}) under $PREFIX"
