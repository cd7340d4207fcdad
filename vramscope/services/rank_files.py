"""Which files under a folder are ranks, and which file stands for each rank (`vramscope ranks`).

Multi-rank jobs write one snapshot per rank, and often one per rank and step. The name
of a file says which rank (and step) it is in the layouts in use:

* torchtitan: `memory_snapshot/iteration_{N}/rank{R}_memory_snapshot.pickle`, and
  `iteration_{N}_exit/` for the dump taken when the run died (an OOM); newer and ported
  versions write `step_{N}/{R:06d}_step_{N}.pickle` (`_exit` on the folder or the file);
* Megatron-LM and Megatron-Bridge: `{stem}_rank-{R}.pickle`, `{stem}_oom_rank-{R}.pickle`
  for the dump of the OOM observer; NeMo's `snapshot_{R}.pickle`;
* anything else that names the rank as `rank{R}`, `rank_{R}` or `rank-{R}`.

`choose` keeps one file per rank named so: its dump at the OOM or exit when there is one
(the moment the run failed), else the latest step, else the last in path order; the
others are skipped, each with the reason. Files whose names say nothing of a rank are
all kept (their rank comes from the metadata `vramscope.record` writes, or from their
sorted order). Only names are read here; nothing is opened.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

# what a snapshot's name ends with; other files are still tried (a snapshot may be named
# anything) unless they are ours or hidden
PICKLE_SUFFIXES = (".pickle", ".pkl", ".pck", ".pk", ".p")
# our own files next to snapshots: annotation sidecars (services/sidecar.py), reports
OWN_SUFFIXES = (".vramscope.json",)
MAX_FILES = 100_000            # a folder of more files than that is not a folder of ranks

_TITAN = re.compile(r"^(?P<rank>\d+)_step_(?P<step>\d+)(?P<exit>_exit)?$", re.IGNORECASE)
_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(?P<rank>\d+)(?![0-9])", re.IGNORECASE)
_NEMO = re.compile(r"^snapshot_(?P<rank>\d+)$", re.IGNORECASE)
_STEP = re.compile(r"(?:^|[^a-z])(?:step|iteration|iter)[_-]?(?P<step>\d+)", re.IGNORECASE)
_EXIT = re.compile(r"(?:^|[_.-])(?:exit|oom)(?:[_.-]|$)", re.IGNORECASE)
_MAX_RANK = 1 << 31            # a number in a name longer than that is not a rank


@dataclass(frozen=True)
class RankFile:
    """A file under the folder and what its name (and its folders' names) say."""
    path: str                  # as it will be opened: the folder given, joined with `relative`
    relative: str              # under the folder, with '/' separators
    rank: int | None           # from the name, or None
    step: int | None           # the step (iteration) of the dump, or None
    exit_dump: bool            # dumped when the run failed (torchtitan `_exit`, Megatron `_oom_`)


@dataclass(frozen=True)
class Skipped:
    """A file not read because another one stands for its rank."""
    path: str
    rank: int
    reason: str


def _stem(name: str) -> str:
    low = name.lower()
    for suf in PICKLE_SUFFIXES:
        if low.endswith(suf):
            return name[: -len(suf)]
    return name


def _number(text: str) -> int | None:
    n = int(text)
    return n if n < _MAX_RANK else None


def describe(folder: str, relative: str) -> RankFile:
    """What the name of `relative` (a path under `folder`, '/'-separated) says."""
    parts = relative.split("/")
    stem = _stem(parts[-1])
    dirs = parts[:-1]
    rank = step = None
    exit_dump = False
    m = _TITAN.match(stem)
    if m:
        rank, step, exit_dump = _number(m["rank"]), _number(m["step"]), bool(m["exit"])
    else:
        m = _RANK.search(stem) or _NEMO.match(stem)
        if m:
            rank = _number(m["rank"])
        m = _STEP.search(stem)
        if m:
            step = _number(m["step"])
        exit_dump = bool(_EXIT.search(stem))
    for d in reversed(dirs):            # the innermost folder that names a step says it
        m = _STEP.search(d)
        if m:
            if step is None:
                step = _number(m["step"])
            exit_dump = exit_dump or bool(_EXIT.search(d))
            break
    return RankFile(os.path.join(folder, *parts), relative, rank, step, exit_dump)


def find_files(folder: str) -> tuple[list[RankFile], list[tuple[str, str]]]:
    """Every regular file under `folder` (sorted; hidden files and folders and our own
    files left out), and the folders or files that could not be listed, with why."""
    found: list[RankFile] = []
    problems: list[tuple[str, str]] = []

    def onerror(e: OSError) -> None:
        problems.append((e.filename or folder, f"cannot list it: {e.strerror or e}"))

    for top, dirs, files in os.walk(folder, onerror=onerror):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel_top = os.path.relpath(top, folder)
        for name in sorted(files):
            if name.startswith(".") or name.lower().endswith(OWN_SUFFIXES):
                continue
            relative = name if rel_top == "." else f"{rel_top.replace(os.sep, '/')}/{name}"
            if len(found) >= MAX_FILES:
                problems.append((folder, f"more than {MAX_FILES:,} files: the rest were not read"))
                return found, problems
            found.append(describe(folder, relative))
    return found, problems


def preference(f: RankFile) -> tuple:
    """The file that stands for a rank sorts last: the exit or OOM dump, then the latest
    step, then path order."""
    return (f.exit_dump, -1 if f.step is None else f.step, f.relative)


def choose(files: list[RankFile]) -> tuple[list[RankFile], list[Skipped]]:
    """One file per rank named in the file names (see the module docstring); the files
    that name no rank are all kept. Returns (kept in path order, skipped)."""
    best: dict[int, RankFile] = {}
    for f in files:
        if f.rank is not None and (f.rank not in best or preference(f) > preference(best[f.rank])):
            best[f.rank] = f
    kept = [f for f in files if f.rank is None or best[f.rank] is f]
    skipped = [Skipped(f.path, f.rank, why_not(f, best[f.rank])) for f in files
               if f.rank is not None and best[f.rank] is not f]
    return kept, skipped


def why_not(f: RankFile, chosen: RankFile) -> str:
    """Why `chosen` stands for the rank instead of `f`, in words."""
    if chosen.exit_dump and not f.exit_dump:
        why = "the dump taken when the run failed"
    elif chosen.step is not None and (f.step is None or chosen.step > f.step):
        why = f"a later step ({chosen.step})"
    else:
        why = "the same rank, later in path order"
    return f"{chosen.relative} is read instead: {why}"


__all__ = ["RankFile", "Skipped", "describe", "find_files", "choose", "preference", "why_not", "PICKLE_SUFFIXES"]
