"""The `vramscope` command ends its process without the interpreter's teardown
(`vramscope.__main__.entry`), and loses nothing by it: what it printed (through a pipe), the exit
code, the exit handlers and the threads the interpreter waits for (the cache's writers) all
come before the end, and where it cannot flush its output the interpreter's own exit says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

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


def test_the_exit_does_not_wait_for_a_structure_nobody_asked_for(tmp_path):
    # the blocks' structure found on a thread (as on a big run) that would take two minutes,
    # and the advice of this run needs no lever: the command ends once its answer and the
    # cache are written (it waited for the structure, 0.3-0.5 s after a 10^6-entry trace)
    cache = tmp_path / "cache"
    prelude = ("import time\nimport vramscope.classifiers.structure as s\ns.BACKGROUND_ROWS = 0\n"
               "build = s._build\ns._build = lambda da, **kw: (time.sleep(120), build(da, **kw))[1]\n")
    file = str(DATA / "forward_only_loop.pickle")
    t0 = time.monotonic()
    p = _command(["summary", file, "--json"], {"VRAMSCOPE_CACHE_DIR": str(cache)}, prelude)
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 60
    doc = json.loads(p.stdout)
    again = _command(["summary", file, "--json"], {"VRAMSCOPE_CACHE_DIR": str(cache)})
    assert again.returncode == 0 and json.loads(again.stdout) == doc
    assert list(cache.rglob("manifest"))


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


@pytest.mark.parametrize("args", [["summary", FILE], ["summary", FILE, "--json"], ["allocations", FILE],
                                  ["--version"], ["--help"], ["summary", "--help"]])
def test_an_output_that_cannot_be_written_is_said_in_one_line_and_exits_2(args):
    """`vramscope summary f > out.txt` on a full disk (/dev/full): one line saying the output
    could not be written, exit 2 (as for an output path that cannot be written), never 0, never
    "internal error" (a bug of ours) and never a traceback; a short output too (written only at
    the end), and argparse's --help."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    code = f"import sys\nimport vramscope.__main__ as m\nsys.argv = ['vramscope'] + {args!r}\nm.entry()\n"
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", code], stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO,
                           env=dict(os.environ, VRAMSCOPE_CACHE_DIR=""), timeout=300)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "cannot write the output: No space left on device" in p.stderr, p.stderr
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr


def test_a_closed_pipe_is_still_a_quiet_end():
    """`vramscope allocations f | head -1`: the rows head takes, exit 0, nothing on stderr (a
    closed pipe is not a write error to report)."""
    code = f"import sys\nimport vramscope.__main__ as m\nsys.argv = ['vramscope', 'allocations', {FILE!r}]\nm.entry()\n"
    p = subprocess.run(f"{sys.executable} -c \"$CODE\" | head -1; exit ${{PIPESTATUS[0]}}", shell=True,
                       executable="/bin/bash", capture_output=True, text=True, cwd=REPO, timeout=300,
                       env=dict(os.environ, VRAMSCOPE_CACHE_DIR="", CODE=code))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.startswith("device,index,")


def test_main_writes_through_the_stream_it_was_given(capsys):
    """Under a test's capture (no file behind stdout) the verbs write to the captured stream as
    before, and stdout is the same object after main() as before it."""
    from vramscope.cli import main
    before = sys.stdout
    assert main(["summary", FILE]) == 0
    assert sys.stdout is before
    assert "trace entries" in capsys.readouterr().out


def test_the_guarded_output_raises_output_error_but_keeps_broken_pipes():
    import errno

    from vramscope.cli import _Output
    from vramscope.cli.errors import OutputError
    if os.path.exists("/dev/full"):
        fd = os.open("/dev/full", os.O_WRONLY)
        try:
            with pytest.raises(OutputError) as e:
                _Output(fd, "w", closefd=False).write(b"x")
            assert e.value.errno == errno.ENOSPC
        finally:
            os.close(fd)
    r, w = os.pipe()
    os.close(r)
    try:
        with pytest.raises(BrokenPipeError):
            _Output(w, "w", closefd=False).write(b"x")
    finally:
        os.close(w)
