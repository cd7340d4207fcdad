"""Which files under a folder are ranks, and which file stands for each rank (`vramscope ranks`).

Multi-rank jobs write one snapshot per rank, and often one per rank and step. The name
of a file (and of its folders) says which rank, step and replica group it is in the
layouts of the frameworks that write them (README "Many ranks" lists each with its source):

* torchtitan today (torchtitan/tools/profiler.py `MEMORY_STEP_DIR`, `MEMORY_EXIT_DIR`,
  `MEMORY_FILE`): `step_{N:012d}/{R:06d}_step_{N}.pickle`, and at an OOM the same file name
  under `step_{N:012d}_exit/`; `vramscope.record` writes exactly this (vramscope before
  issue 30 put `_exit` on the file too: read as well);
* torchtitan before (torchtitan/tools/profiling.py): `iteration_{N}/rank{R}_memory_snapshot.pickle`,
  `iteration_{N}_exit/` for the dump at an OOM;
* torchft under torchtitan (torchtitan/train.py `leaf_folder`): one folder per replica group,
  `replica_{i}/`, inside the step folder; each group numbers its ranks from 0, so a rank is
  (replica group, rank) and ranks.py numbers them replica by replica;
* Megatron-Bridge (megatron/bridge/training/utils/train_utils.py): `{base}_{R}{ext}` at
  `profile_step_end` and `{base}_oom_rank-{R}{ext}` from the OOM observer, for any
  `memory_snapshot_path` = `{base}{ext}` (default `snapshot.pickle`);
* Megatron-LM: `oom_rank-{R}_{path}` from the OOM observer (pretrain_gpt.py; the regular
  `{path}` is written by the last rank alone and names none), and in newer versions
  (megatron/training/utils/utils.py) `{stem}_rank-{R}{suffix}`, `{stem}_oom_rank-{R}{suffix}`
  (`{stem}_oom_rank_{R}{suffix}` in some);
* anything else that names the rank as `rank{R}`, `rank_{R}` or `rank-{R}`, in the file's
  name or else in a folder's.

A `{base}_{R}` name is Megatron-Bridge's only where the folder shows it: another file of the
same base beside it (`{base}_{M}`, `{base}_oom_rank-{M}`), or the default base `snapshot`; a
lone `llama_70.pickle` is no rank 70. A number of 2^24 or more is never a rank (timestamps).

`choose` keeps one file per (replica group, rank) named so: its dump at the OOM or exit when
there is one (the moment the run failed), else the latest step, else the last in path order;
the others are skipped, each with the reason. Files whose names say nothing of a rank are
all kept (their rank comes from the metadata `vramscope.record` writes, or from their sorted
order). Only names are read here; nothing is opened.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from dataclasses import dataclass

# what a snapshot's name ends with; other files are still tried (a snapshot may be named
# anything) unless they are ours or hidden
PICKLE_SUFFIXES = (".pickle", ".pkl", ".pck", ".pk", ".p")
# our own files next to snapshots: annotation sidecars (services/sidecar.py), reports
OWN_SUFFIXES = (".vramscope.json",)
MAX_FILES = 100_000            # a folder of more files than that is not a folder of ranks

_TITAN = re.compile(r"^(?P<rank>\d+)_step_(?P<step>\d+)(?P<exit>_exit)?$", re.IGNORECASE)
_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(?P<rank>\d+)(?![0-9])", re.IGNORECASE)
_BRIDGE = re.compile(r"^(?P<base>.+?)_(?P<rank>\d+)$")                     # {base}_{R}
_BRIDGE_OOM = re.compile(r"^(?P<base>.+?)_oom_rank[-_]?(?P<rank>\d+)$", re.IGNORECASE)   # {base}_oom_rank-{R}
_BRIDGE_DEFAULT = "snapshot"                                                 # its default memory_snapshot_path
_REPLICA = re.compile(r"^replica_(?P<replica>\d+)$", re.IGNORECASE)
_STEP = re.compile(r"(?:^|[^a-z])(?:step|iteration|iter)[_-]?(?P<step>\d+)", re.IGNORECASE)
_STEP_END = re.compile(r"(?:^|[^a-z])(?:step|iteration|iter|epoch)[_-]?\d+$", re.IGNORECASE)
_EXIT = re.compile(r"(?:^|[_.-])(?:exit|oom)(?:[_.-]|$)", re.IGNORECASE)
_MAX_RANK = 1 << 24            # as the metadata's bound (parsers/metadata.py): a larger number is no rank
_MAX_STEP = 1 << 62


@dataclass(frozen=True)
class RankFile:
    """A file under the folder and what its name (and its folders' names) say."""
    path: str                  # as it will be opened: the folder given, joined with `relative`
    relative: str              # under the folder, with '/' separators
    rank: int | None           # from the name, or None (within its replica group, when it has one)
    step: int | None           # the step (iteration) of the dump, or None
    exit_dump: bool            # dumped when the run failed (torchtitan `_exit`, Megatron `_oom_`)
    replica: int | None = None  # torchft's replica group (`replica_{i}/`), or None

    @property
    def key(self) -> tuple[int, int] | None:
        """What one file stands for: (replica group or -1, rank), None without a rank."""
        return None if self.rank is None else (-1 if self.replica is None else self.replica, self.rank)


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


def _number(text: str, bound: int = _MAX_RANK) -> int | None:
    n = int(text)
    return n if n < bound else None


def describe(folder: str, relative: str) -> RankFile:
    """What the name of `relative` (a path under `folder`, '/'-separated) says. A
    `{base}_{R}` name says nothing here: `find_files` decides it from the files beside it."""
    parts = relative.split("/")
    stem = _stem(parts[-1])
    dirs = parts[:-1]
    rank = step = None
    exit_dump = False
    m = _TITAN.match(stem)
    if m:
        rank, step, exit_dump = _number(m["rank"]), _number(m["step"], _MAX_STEP), bool(m["exit"])
    else:
        m = _RANK.search(stem)
        if m:
            rank = _number(m["rank"])
        m = _STEP.search(stem)
        if m:
            step = _number(m["step"], _MAX_STEP)
        exit_dump = bool(_EXIT.search(stem))
    replica = None
    named_step = False
    for d in reversed(dirs):            # the innermost folder that names a step, a replica, a rank says it
        m = _REPLICA.match(d)
        if m:
            replica = replica if replica is not None else _number(m["replica"])
            continue
        m = _STEP.search(d)
        if m and not named_step:
            named_step = True
            if step is None:
                step = _number(m["step"], _MAX_STEP)
            exit_dump = exit_dump or bool(_EXIT.search(d))
            continue
        m = _RANK.search(d)             # `rank3/snapshot.pickle`, Megatron-LM's `oom_rank-3_{dir}/...`
        if m and rank is None:
            rank = _number(m["rank"])
            exit_dump = exit_dump or bool(_EXIT.search(d))
    return RankFile(os.path.join(folder, *parts), relative, rank, step, exit_dump, replica)


def _bridge_ranks(files: list[RankFile]) -> list[RankFile]:
    """Megatron-Bridge's `{base}_{R}{ext}`: a rank where the folder shows the layout (the
    module docstring); the other files as they were."""
    def bridge(f: RankFile):
        name = f.relative.rsplit("/", 1)[-1]
        stem = _stem(name)
        m = _BRIDGE.match(stem)
        if f.rank is not None or m is None or _STEP_END.search(stem):
            return None
        return f.relative[: len(f.relative) - len(name)], m["base"], name[len(stem):], m["rank"]
    oom_bases = set()
    for f in files:
        name = f.relative.rsplit("/", 1)[-1]
        m = _BRIDGE_OOM.match(_stem(name))
        if m:
            oom_bases.add((f.relative[: len(f.relative) - len(name)], m["base"], name[len(_stem(name)):]))
    found = {id(f): b for f in files if (b := bridge(f)) is not None}
    bases = Counter(b[:3] for b in found.values())
    out = []
    for f in files:
        b = found.get(id(f))
        if b is not None and (bases[b[:3]] > 1 or b[:3] in oom_bases or b[1].lower() == _BRIDGE_DEFAULT):
            rank = _number(b[3])
            if rank is not None:
                f = dataclasses.replace(f, rank=rank)
        out.append(f)
    return out


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
                return _bridge_ranks(found), problems
            found.append(describe(folder, relative))
    return _bridge_ranks(found), problems


def preference(f: RankFile) -> tuple:
    """The file that stands for a rank sorts last: the exit or OOM dump, then the latest
    step, then path order."""
    return (f.exit_dump, -1 if f.step is None else f.step, f.relative)


def choose(files: list[RankFile]) -> tuple[list[RankFile], list[Skipped]]:
    """One file per (replica group, rank) named in the file names (see the module
    docstring); the files that name no rank are all kept. Returns (kept in path order,
    skipped)."""
    best: dict[tuple[int, int], RankFile] = {}
    for f in files:
        k = f.key
        if k is not None and (k not in best or preference(f) > preference(best[k])):
            best[k] = f
    kept = [f for f in files if f.key is None or best[f.key] is f]
    skipped = [Skipped(f.path, f.rank, why_not(f, best[f.key])) for f in files          # type: ignore[arg-type]
               if f.key is not None and best[f.key] is not f]
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
