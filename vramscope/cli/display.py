"""Whether the viewer can open a window here, decided before Qt is started.

Without a usable display Qt does not fail politely: with no DISPLAY it aborts the process
(SIGABRT and five lines about the xcb platform plugin), with a missing system library it
aborts the same way, and with QT_QPA_PLATFORM=offscreen it runs forever with no window
anyone can see. Most snapshots are recorded on remote GPU boxes without a display, so
`vramscope FILE` checks first and says in one line what to do instead.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

HEADLESS = ("vramscope summary FILE, vramscope report FILE -o DIR, "
            "or vramscope view FILE --screenshot OUT.png")
_NO_WINDOW_PLATFORMS = ("offscreen", "minimal", "minimalegl")
# Debian/Ubuntu package names where the soname rule (libfoo.so.N -> libfooN) does not give them
_PACKAGES = {"libglib-2.0.so.0": "libglib2.0-0", "libX11-xcb.so.1": "libx11-xcb1", "libX11.so.6": "libx11-6",
             "libSM.so.6": "libsm6", "libICE.so.6": "libice6", "libEGL.so.1": "libegl1", "libGL.so.1": "libgl1",
             "libOpenGL.so.0": "libopengl0", "libGLX.so.0": "libglx0"}


def display_problem() -> str | None:
    """One line saying why no window can open here, or None when one can (or we cannot tell:
    Windows and macOS always have a display server)."""
    if sys.platform in ("win32", "darwin"):
        return None
    platform = os.environ.get("QT_QPA_PLATFORM", "").split(":")[0].strip().lower()
    if platform in _NO_WINDOW_PLATFORMS:
        return f"QT_QPA_PLATFORM={platform} shows no window"
    x11, wayland = os.environ.get("DISPLAY", ""), os.environ.get("WAYLAND_DISPLAY", "")
    if platform.startswith("wayland") or (not platform and wayland and not x11):
        return None if _wayland_reachable(wayland) else f"no Wayland display at {wayland or '(WAYLAND_DISPLAY unset)'}"
    if platform and platform != "xcb":
        return None                         # eglfs, vnc, linuxfb...: the user knows what they asked for
    if not x11:
        return "no display (DISPLAY and WAYLAND_DISPLAY are unset)"
    if not _x11_reachable(x11):
        return f"cannot reach the X display {x11}"
    missing = missing_xcb_libraries()
    if missing:
        pkgs = " ".join(debian_package(m) for m in missing)
        return (f"Qt's xcb platform plugin needs {', '.join(missing)} "
                f"(Debian/Ubuntu: sudo apt install {pkgs})")
    return None


def _x11_reachable(display: str) -> bool:
    m = re.match(r"^(?P<host>[^:]*):(?P<num>\d+)(?:\.\d+)?$", display)
    if not m:
        return True                         # a form we do not know: let Qt try
    host, num = m.group("host"), int(m.group("num"))
    if host in ("", "unix") or host.startswith("/"):
        path = host if host.startswith("/") else f"/tmp/.X11-unix/X{num}"
        if os.path.exists(path):
            return True
        return _abstract_x11_socket(num)
    try:
        with socket.create_connection((host, 6000 + num), timeout=0.5):
            return True
    except OSError:
        return False


def _abstract_x11_socket(num: int) -> bool:
    """Linux X servers also listen on an abstract socket (no file in /tmp/.X11-unix)."""
    if not sys.platform.startswith("linux"):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(f"\0/tmp/.X11-unix/X{num}")
        return True
    except OSError:
        return False
    finally:
        s.close()


def _wayland_reachable(name: str) -> bool:
    if not name:
        return False
    path = name if name.startswith("/") else os.path.join(os.environ.get("XDG_RUNTIME_DIR", ""), name)
    return os.path.exists(path)


def missing_xcb_libraries() -> list[str]:
    """System libraries Qt's xcb plugin links to that the dynamic linker cannot find
    (`ldd` on the plugin); [] when all are there or we cannot tell."""
    ldd = shutil.which("ldd")
    plugin = _xcb_plugin()
    if ldd is None or plugin is None:
        return []
    try:
        out = subprocess.run([ldd, plugin], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    missing = []
    for line in out.splitlines():
        if "not found" in line:
            name = line.split("=>")[0].strip()
            if name and name not in missing:
                missing.append(name)
    return missing


def _xcb_plugin() -> str | None:
    import importlib.util
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        p = os.path.join(base, "Qt", "plugins", "platforms", "libqxcb.so")
        if os.path.exists(p):
            return p
    return None


def debian_package(soname: str) -> str:
    """libxcb-icccm.so.4 -> libxcb-icccm4, libxkbcommon-x11.so.0 -> libxkbcommon-x11-0."""
    if soname in _PACKAGES:
        return _PACKAGES[soname]
    m = re.match(r"^(lib.+)\.so\.(\d+)", soname)
    if not m:
        return soname
    name, ver = m.group(1).lower(), m.group(2)
    return f"{name}-{ver}" if name[-1].isdigit() else f"{name}{ver}"


__all__ = ["display_problem", "missing_xcb_libraries", "debian_package", "HEADLESS"]
