"""Entry point of the PyInstaller bundle: the same `vramscope` command as the
installed console script (vramscope.__main__:entry: Ctrl-C while importing and at shutdown
is one line and exit 130 too; the process ends without the interpreter's teardown), frozen.

The bundle is a console executable so that `summary`, `allocations` and
`--screenshot` print and return exit codes as they do when pip-installed;
`vramscope FILE` (no verb) opens the viewer.
"""
import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()  # harmless if nothing spawns workers
    from vramscope.__main__ import entry

    entry()
