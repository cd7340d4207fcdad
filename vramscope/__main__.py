"""`python -m vramscope` and the `vramscope` command (pyproject.toml's script entry point).

Ctrl-C at any moment is one line, `vramscope VERB: interrupted`, and exit 130 (DESIGN.md §6):
the command line's own handler (cli/__init__.py) covers the verbs; this covers the imports
before it (a fifth of a second, more on a busy machine) and the interpreter's shutdown after
it, where a KeyboardInterrupt would print a traceback and end the process by the signal.

`entry` (the `vramscope` command) ends the process once the interpreter's exit has joined the
threads that must finish and run the exit handlers, without the teardown after them that frees
every object one by one: after `view` of a 10^7-event snapshot that was 0.2 s of ~1 GB of arrays
and Qt's widgets freed for nothing.
"""
import atexit
import os
import re
import signal
import sys

from .common.later import leaving

EXIT_INTERRUPTED = 130


def _verb(argv: list[str]) -> str:
    """`vramscope VERB` as the command line names itself, without importing it."""
    word = argv[1] if len(argv) > 1 else ""
    return f"vramscope {word}" if re.fullmatch(r"[a-z]+", word) and not os.path.exists(word) else "vramscope"


def run() -> int:
    interrupted: list[int] = []

    def on_ctrl_c(signum, frame):            # Python's own handler, and a note that it ran
        interrupted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_ctrl_c)
    # one BLAS thread (before numpy's import; the parse's helper processes inherit it): our
    # matrix products are a few small ones, and OpenBLAS's pool, a thread a CPU, cost 0.1 s of
    # CPU at every start and spun beside the analysis after each product
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        from .common.memory import fewer_collections, keep_freed_pages, one_malloc_arena
        one_malloc_arena()                   # before any thread (the reader's, the analysis's, Qt's)
        keep_freed_pages()
        fewer_collections()
        from .cli import main
        return main()                        # from here its own handler says "interrupted"
    except BaseException as e:
        # Ctrl-C while importing: a KeyboardInterrupt, or what a C extension's import made of
        # it (numpy's: an ImportError, "PyCapsule_Import could not import module 'datetime'")
        if not interrupted or isinstance(e, SystemExit):
            raise
        sys.stderr.write(f"{_verb(sys.argv)}: interrupted\n")
        return EXIT_INTERRUPTED
    finally:
        # from here the process only exits: a Ctrl-C now would interrupt the interpreter's
        # shutdown (its atexit handlers join threads) with a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # CPython takes a KeyboardInterrupt that left an exec() of a string for one nobody
        # caught (pythonrun.c run_eval_code_obj sets _Py_UnhandledKeyboardInterrupt), and then
        # ends the process by SIGINT instead of our exit code: Ctrl-C during an import that
        # builds a dataclass (dataclasses exec()s its __init__) did so. The next such exec
        # clears that record, so this one does.
        exec("pass")


def _end_now(code: list[int]) -> None:
    """The last exit handler (registered before any other): stdout and stderr flushed, the
    process ends with `run()`'s code. Where `run()` did not return (an exception) or a stream
    cannot be flushed (a full disk), the interpreter's own exit goes on and says so."""
    if not code:
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code[0])


def entry() -> None:
    """The `vramscope` command (pyproject.toml): `run()`, then an exit without the teardown."""
    code: list[int] = []
    atexit.register(_end_now, code)        # first registered: run after every other handler
    rc = run()
    leaving()                              # (what only prepared for later is not waited for)
    code.append(rc if isinstance(rc, int) else 0)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
