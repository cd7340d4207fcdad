"""The `vramscope` command ends its process without the interpreter's teardown
(`vramscope.__main__.entry`), and loses nothing by it: what it printed (through a pipe), the exit
code, the exit handlers and the threads the interpreter waits for (the cache's writers) all
come before the end, and where it cannot flush its output the interpreter's own exit says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import DATA, REPO

FILE = str(DATA / "clean_loop.pickle")


def _command(args, env_extra=None, prelude=""):
    """`python -c` running `entry()` as the console script does (stdout through a pipe)."""
    code = (f"import sys\n{prelude}\nimport vramscope.__main__ as m\n"
            f"sys.argv = ['vramscope'] + {list(args)!r}\nm.entry()\n")
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)


def test_output_exit_code_and_cache_are_whole(tmp_path):
    cache = tmp_path / "cache"
    p = _command(["summary", FILE, "--json"], {"VRAMSCOPE_CACHE_DIR": str(cache)})
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)                       # every byte of it, through the pipe
    assert doc["devices"]
    # the cache was written whole before the end: the next run reads it, and says the same
    manifests = list(cache.rglob("manifest"))
    assert manifests and all(m.stat().st_size > 0 for m in manifests)
    again = _command(["summary", FILE, "--json"], {"VRAMSCOPE_CACHE_DIR": str(cache)})
    assert again.returncode == 0 and json.loads(again.stdout) == doc


def test_exit_codes_and_one_line_errors_stay(tmp_path):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04cos\nsystem\n.")
    p = _command(["summary", str(bad)], {"VRAMSCOPE_CACHE_DIR": ""})
    assert p.returncode == 3 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    p = _command(["no-such-verb"])
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_later_exit_handlers_and_waited_threads_run_first():
    # a handler registered after entry's (as any library's is) runs before the process ends,
    # and so does a non-daemon thread's work (the interpreter waits for it before the handlers)
    prelude = ("import atexit, threading, time\n"
               "def late():\n    time.sleep(0.3); print('thread done', flush=True)\n"
               "import vramscope.cli as cli\n_main = cli.main\n"
               "def main(*a, **k):\n"
               "    atexit.register(lambda: print('handler ran', flush=True))\n"
               "    threading.Thread(target=late, daemon=False).start()\n"
               "    return _main(*a, **k)\n"
               "cli.main = main\n"
               "class Held:\n    def __del__(self):\n        print('torn down', flush=True)\n"
               "held = Held()\n")
    p = _command(["summary", FILE], {"VRAMSCOPE_CACHE_DIR": ""}, prelude)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-2:] == ["thread done", "handler ran"], lines[-3:]
    assert "torn down" not in lines          # what is alive at the end is not freed one by one


def test_an_output_that_cannot_be_flushed_is_not_passed_over(tmp_path):
    if not os.path.exists("/dev/full"):
        return
    code = (f"import sys\nimport vramscope.__main__ as m\nsys.argv = ['vramscope', 'summary', {FILE!r}]\n"
            "m.entry()\n")
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", code], stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO,
                           env=dict(os.environ, VRAMSCOPE_CACHE_DIR=""), timeout=300)
    assert p.returncode != 0 and "Traceback" not in p.stderr
