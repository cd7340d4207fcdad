"""Qt fixtures for the viewer tests: offscreen, Qt warnings fail, no window may outlive its test."""
from __future__ import annotations

import gc
import os

import pytest

import vramscope.viewer  # noqa: F401  (first: works around PySide6's None/True/False refcounts on 3.11)

# before any QApplication exists (pytest-qt creates it lazily, in the `qapp` fixture)
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# The offscreen plugin's own screen is 800x800; the window fits the screen it opens on
# (issue 33), so the tests' 1400x900 windows get a virtual screen of 1920x1200
# (the plugin's JSON screen configuration). The screen-fit tests run on 1024x700 and
# 800x500 ones (test_viewer_screen_fit.py starts them so).
SCREENS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "screens")
if os.environ["QT_QPA_PLATFORM"] == "offscreen":
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={os.path.join(SCREENS, '1920x1200.json')}"

# Said by the offscreen platform plugin whenever a window is shown: not a defect of ours.
QT_NOISE = ("This plugin does not support propagateSizeHints()",)


class _QtMessages:
    """Records Qt warnings, criticals and fatals (debug and info pass)."""

    def __init__(self):
        self.records: list[str] = []

    def __call__(self, mode, context, message):
        from PySide6.QtCore import QtMsgType
        if mode in (QtMsgType.QtDebugMsg, QtMsgType.QtInfoMsg) or message in QT_NOISE:
            return
        self.records.append(f"{mode.name}: {message}")


def _top_levels():
    from PySide6.QtWidgets import QApplication
    import shiboken6
    return {shiboken6.getCppPointer(w)[0]: w for w in QApplication.topLevelWidgets()}


def _flush(app):
    from PySide6.QtCore import QCoreApplication, QEvent
    for _ in range(3):
        app.processEvents()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        gc.collect()


def pytest_configure(config):
    """The application, made once, before any test: on the virtual screen above. (Made later,
    by whichever test first needed Qt, it took that test's environment: test_report.py's
    QT_QPA_PLATFORM=offscreen made the session's screen 800x800 for every viewer test after
    it, and their windows no longer fitted.)"""
    try:
        from PySide6.QtWidgets import QApplication
    except ImportError:
        return
    if QApplication.instance() is None:
        from vramscope.viewer.app import make_app
        make_app()


@pytest.fixture(autouse=True)
def own_settings_folder(tmp_path_factory, monkeypatch):
    """Every test starts from its own settings folder (QSettings: the window's geometry,
    layout, recent files) and user folders (notes, cache, rules), so nothing one test saves
    is read by another, and nothing is left in the user's home (issue 33: a layout saved
    by an earlier test starved a later test's plot)."""
    home = tmp_path_factory.mktemp("home")
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache")):
        monkeypatch.setenv(var, str(home / sub))
    try:
        from PySide6.QtCore import QSettings
    except ImportError:          # (the product's Qt-free layers are tested without Qt too)
        yield home
        return
    for fmt in (QSettings.Format.NativeFormat, QSettings.Format.IniFormat):
        for scope in (QSettings.Scope.UserScope, QSettings.Scope.SystemScope):
            QSettings.setPath(fmt, scope, str(home / "config"))
    yield home


@pytest.fixture
def qt(qapp, qtbot):
    """qtbot, with Qt warnings turned into failures and a check that every top-level
    widget the test created is gone once it is closed."""
    from PySide6.QtCore import qInstallMessageHandler
    messages = _QtMessages()
    qInstallMessageHandler(messages)
    before = set(_top_levels())
    font, palette, style, sheet = qapp.font(), qapp.palette(), qapp.style().name(), qapp.styleSheet()
    try:
        yield qtbot
        # pytest-qt closes the widgets given to qtbot.addWidget before this runs
        qInstallMessageHandler(messages)     # pytest-qt's log capture may have replaced ours
        _flush(qapp)
        leaked = {k: w for k, w in _top_levels().items() if k not in before}
        names = sorted(f"{type(w).__name__}({w.objectName() or w.windowTitle()!r})" for w in leaked.values())
        for w in leaked.values():
            w.close()
            w.deleteLater()
        _flush(qapp)
        assert not messages.records, "Qt warnings:\n  " + "\n  ".join(messages.records)
        assert not names, f"top-level widgets left alive: {', '.join(names)}"
    finally:
        qInstallMessageHandler(None)
        # the application as the test found it (a test that changed the font, the palette or
        # the style must not change the next test's sizes)
        if qapp.style().name() != style:
            qapp.setStyle(style)
        if qapp.styleSheet() != sheet:
            qapp.setStyleSheet(sheet)
        if qapp.font() != font:
            qapp.setFont(font)
        if qapp.palette() != palette:
            qapp.setPalette(palette)


@pytest.fixture
def window(qt):
    """A shown 1400x900 main window that remembers nothing and caches nothing
    (viewer_helpers.new_window); a test file may define its own."""
    from viewer_helpers import new_window
    return new_window(qt)


def pytest_collection_modifyitems(session, config, items):
    """VRAMSCOPE_TEST_SHUFFLE=SEED runs the tests in a shuffled order (the modules in a
    random order, and the tests within each module): a test that passes only after another
    one, or fails after one, shows. Modules stay whole, as pytest-randomly keeps them, so
    a module's fixtures are set up once."""
    seed = os.environ.get("VRAMSCOPE_TEST_SHUFFLE")
    if not seed:
        return
    import random
    rng = random.Random(seed)
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = list(modules)
    rng.shuffle(order)
    items[:] = [it for name in order for it in rng.sample(modules[name], len(modules[name]))]


def pytest_report_header(config):
    seed = os.environ.get("VRAMSCOPE_TEST_SHUFFLE")
    return f"vramscope: tests shuffled with seed {seed!r}" if seed else None
