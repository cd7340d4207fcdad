"""Load, merge and validate classification rules (the schema is documented in rules.toml).

The shipped rules live in `rules.toml` next to this file (read with `tomllib`, or on
Python 3.10 with `tomli`, a dependency there). A user file (TOML or JSON, same schema) is
found in this order:
`analyze(..., rules_path=...)`, `$VRAMSCOPE_RULES`, `~/.config/vramscope/rules.toml`,
`~/.config/vramscope/rules.json` (`$XDG_CONFIG_HOME` is honoured). Its rules are tried
before the shipped ones; a rule with a shipped id replaces that rule; `disable = [ids]`
drops shipped rules; its markers extend the shipped markers of the same name unless
listed in `replace_markers`.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .categories import CATEGORIES
from .evidence import rule_evidence
from .stacks import KIND_CODES

HERE = Path(__file__).resolve().parent
SHIPPED_TOML = HERE / "rules.toml"

PHASES = ("none", "inputs", "forward", "backward", "optimizer", "pre")
FREE_PHASES = PHASES[:5] + ("never",)
FREED = ("same_phase", "later_phase", "later_iteration", "never")
SIZE_MATCHES = ("quantized", "gradients", "optimizer_moments", "parameters", "autocast_copy", "cublas_workspace",
                "fours_weights", "fours_gradients", "fours_moments")
RULE_EVIDENCE = ("stack", "lifetime", "guess")     # a rule cannot claim torch's own tag


class RulesError(ValueError):
    """A rules file that cannot be used (bad TOML/JSON, unknown key, bad regex)."""


@dataclass(frozen=True)
class Matcher:
    file: str | None = None
    name: str | None = None
    kind: tuple | None = None     # frame kind codes (stacks.KIND_*)


@dataclass
class Rule:
    id: str
    category: str
    why: str = ""
    markers: tuple = ()
    not_markers: tuple = ()
    stack_phase: tuple | None = None
    top: tuple | None = None
    op: str | None = None
    frames: str | None = None
    phase: tuple | None = None
    free_phase: tuple | None = None
    freed: tuple | None = None
    preexisting: bool | None = None
    before_training: bool | None = None
    size_match: str | None = None
    innermost: tuple | None = None
    max_allocs_alive: int | None = None
    freed_within: str | None = None
    free_markers: tuple = ()        # the stack of its free has every one of these markers
    free_not_markers: tuple = ()    # the stack of its free has frames and none of these
    profiler_converted: bool | None = None
    trace: bool | None = None       # the device's trace holds allocations (False: a state-only dump)
    evidence: str = ""              # what the verdict rests on (evidence.py); "" until _check fills it
    source: str = "shipped"


@dataclass
class RuleSet:
    markers: dict                    # name -> list[Matcher]
    levels: list                     # list of lists of marker names
    timeline: dict                   # phase marker -> timeline phase name
    annotations: list                # [(compiled regex, phase name)]
    rules: list                      # ordered list[Rule]
    sources: list = field(default_factory=list)

    @property
    def phase_markers(self) -> list:
        return [m for level in self.levels for m in level]


_RULE_KEYS = {"id", "category", "why", "markers", "not_markers", "stack_phase", "top", "op", "frames", "phase",
              "free_phase", "freed", "preexisting", "before_training", "size_match", "innermost",
              "max_allocs_alive", "freed_within", "profiler_converted", "trace", "evidence", "free_markers",
              "free_not_markers"}
_TOP_KEYS = {"version", "phases", "annotation", "markers", "rule", "disable", "replace_markers"}


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RulesError(f"cannot read rules file {path}: {e.strerror or e}") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except ValueError as e:
            raise RulesError(f"{path}: not valid JSON ({e})") from None
    # imported here: a cached `vramscope summary` never reads a rules file
    if sys.version_info >= (3, 11):
        import tomllib
    else:                               # pyproject.toml: tomli; python_version < "3.11"
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RulesError(f"{path}: not valid TOML ({e})") from None


def _regex(value, where: str) -> str:
    if not isinstance(value, str):
        raise RulesError(f"{where}: expected a regex string, got {type(value).__name__}")
    try:
        re.compile(value)
    except re.error as e:
        raise RulesError(f"{where}: bad regex {value!r} ({e})") from None
    return value


def _matcher(d, where: str) -> Matcher:
    if not isinstance(d, dict):
        raise RulesError(f"{where}: a frame matcher is a table like {{ file = '...', name = '...' }}")
    extra = set(d) - {"file", "name", "kind"}
    if extra:
        raise RulesError(f"{where}: unknown matcher key(s) {sorted(extra)}")
    kind = d.get("kind")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        bad = [k for k in kinds if k not in KIND_CODES]
        if bad or not isinstance(kinds, list):
            raise RulesError(f"{where}: kind must be one of {sorted(KIND_CODES)}")
        kind = tuple(KIND_CODES[k] for k in kinds)
    return Matcher(file=_regex(d["file"], where + ".file") if "file" in d else None,
                   name=_regex(d["name"], where + ".name") if "name" in d else None, kind=kind)


def _names(value, where: str, allowed=None) -> tuple:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RulesError(f"{where}: expected a list of names")
    if allowed is not None:
        bad = [v for v in value if v not in allowed]
        if bad:
            raise RulesError(f"{where}: unknown value(s) {bad}; allowed: {list(allowed)}")
    return tuple(value)


def _rule(d, where: str, source: str) -> Rule:
    if not isinstance(d, dict):
        raise RulesError(f"{where}: a rule is a table")
    extra = set(d) - _RULE_KEYS
    if extra:
        raise RulesError(f"{where}: unknown rule key(s) {sorted(extra)}")
    rid = d.get("id")
    if not isinstance(rid, str) or not rid:
        raise RulesError(f"{where}: every rule needs an id")
    where = f"{where} ({rid})"
    cat = d.get("category")
    if cat not in CATEGORIES:
        raise RulesError(f"{where}: category must be one of {list(CATEGORIES)}")
    r = Rule(id=rid, category=cat, why=str(d.get("why", "")), source=source)
    if "markers" in d:
        r.markers = _names(d["markers"], where + ".markers")
    if "not_markers" in d:
        r.not_markers = _names(d["not_markers"], where + ".not_markers")
    if "free_markers" in d:
        r.free_markers = _names(d["free_markers"], where + ".free_markers")
    if "free_not_markers" in d:
        r.free_not_markers = _names(d["free_not_markers"], where + ".free_not_markers")
    if "stack_phase" in d:
        r.stack_phase = _names(d["stack_phase"], where + ".stack_phase")
    if "top" in d:
        tops = d["top"] if isinstance(d["top"], list) else [d["top"]]
        r.top = tuple(_matcher(m, f"{where}.top[{i}]") for i, m in enumerate(tops))
    if "innermost" in d:
        ms = d["innermost"] if isinstance(d["innermost"], list) else [d["innermost"]]
        r.innermost = tuple(_matcher(m, f"{where}.innermost[{i}]") for i, m in enumerate(ms))
    if "max_allocs_alive" in d:
        v = d["max_allocs_alive"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise RulesError(f"{where}: max_allocs_alive must be a non-negative integer")
        r.max_allocs_alive = v
    if "freed_within" in d:
        if not isinstance(d["freed_within"], str) or not d["freed_within"]:
            raise RulesError(f"{where}: freed_within must be a marker name")
        r.freed_within = d["freed_within"]
    if "op" in d:
        r.op = _regex(d["op"], where + ".op")
    if "frames" in d:
        if d["frames"] not in ("empty", "present"):
            raise RulesError(f"{where}: frames must be 'empty' or 'present'")
        r.frames = d["frames"]
    if "phase" in d:
        r.phase = _names(d["phase"], where + ".phase", PHASES)
    if "free_phase" in d:
        r.free_phase = _names(d["free_phase"], where + ".free_phase", FREE_PHASES)
    if "freed" in d:
        r.freed = _names(d["freed"], where + ".freed", FREED)
    for key in ("preexisting", "before_training", "profiler_converted", "trace"):
        if key in d:
            if not isinstance(d[key], bool):
                raise RulesError(f"{where}: {key} must be true or false")
            setattr(r, key, d[key])
    if "evidence" in d:
        if d["evidence"] not in RULE_EVIDENCE:
            raise RulesError(f"{where}: evidence must be one of {list(RULE_EVIDENCE)}")
        r.evidence = d["evidence"]
    if "size_match" in d:
        if d["size_match"] not in SIZE_MATCHES:
            raise RulesError(f"{where}: size_match must be one of {list(SIZE_MATCHES)}")
        r.size_match = d["size_match"]
    return r


def _parse(doc: dict, source: str) -> dict:
    if not isinstance(doc, dict):
        raise RulesError(f"{source}: the top level must be a table")
    extra = set(doc) - _TOP_KEYS
    if extra:
        raise RulesError(f"{source}: unknown top-level key(s) {sorted(extra)}")
    markers = {}
    for name, ms in (doc.get("markers") or {}).items():
        if not isinstance(ms, list):
            raise RulesError(f"{source}: markers.{name} must be a list of frame matchers")
        markers[name] = [_matcher(m, f"{source}: markers.{name}[{i}]") for i, m in enumerate(ms)]
    out = {"markers": markers,
           "rules": [_rule(r, f"{source}: rule[{i}]", source) for i, r in enumerate(doc.get("rule") or [])],
           "disable": _names(doc.get("disable", []), f"{source}: disable"),
           "replace_markers": _names(doc.get("replace_markers", []), f"{source}: replace_markers")}
    ph = doc.get("phases")
    if ph is not None:
        levels = ph.get("levels")
        if levels is not None:
            if not isinstance(levels, list) or not all(isinstance(lv, list) for lv in levels):
                raise RulesError(f"{source}: phases.levels must be a list of lists of marker names")
            out["levels"] = [list(_names(lv, f"{source}: phases.levels")) for lv in levels]
        tl = ph.get("timeline")
        if tl is not None:
            for k, v in tl.items():
                if v not in PHASES[:5]:
                    raise RulesError(f"{source}: phases.timeline.{k} must be one of {list(PHASES[:5])}")
            out["timeline"] = dict(tl)
    anns = []
    for i, a in enumerate(doc.get("annotation") or []):
        if not isinstance(a, dict) or "name" not in a or a.get("phase") not in PHASES[:5]:
            raise RulesError(f"{source}: annotation[{i}] needs name (regex) and phase (one of {list(PHASES[:5])})")
        anns.append((re.compile(_regex(a["name"], f"{source}: annotation[{i}].name")), a["phase"]))
    out["annotations"] = anns
    return out


def user_rules_path(explicit=None) -> Path | None:
    """The user's rules file, if any (explicit argument, $VRAMSCOPE_RULES, ~/.config)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("VRAMSCOPE_RULES")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "vramscope"
    for name in ("rules.toml", "rules.json"):
        p = base / name
        if p.is_file():
            return p
    return None


_SHIPPED_CACHE: dict = {}


def load_rules(rules_path=None, use_user_rules: bool = True) -> RuleSet:
    """The shipped rules merged with the user's (see module docstring)."""
    key = "shipped"
    if key not in _SHIPPED_CACHE:
        _SHIPPED_CACHE[key] = _parse(_read(SHIPPED_TOML), str(SHIPPED_TOML))
    base = _SHIPPED_CACHE[key]
    markers = {k: list(v) for k, v in base["markers"].items()}
    rules = list(base["rules"])
    levels = [list(lv) for lv in base["levels"]]
    timeline = dict(base["timeline"])
    annotations = list(base["annotations"])
    sources = [str(SHIPPED_TOML)]
    path = user_rules_path(rules_path) if (use_user_rules or rules_path) else None
    if path is not None:
        user = _parse(_read(path), str(path))
        sources.append(str(path))
        for name, ms in user["markers"].items():
            if name in user["replace_markers"] or name not in markers:
                markers[name] = list(ms)
            else:
                markers[name].extend(ms)
        user_ids = {r.id for r in user["rules"]}
        dropped = set(user["disable"]) | user_ids
        rules = [r for r in user["rules"]] + [r for r in rules if r.id not in dropped]
        levels = user.get("levels", levels)
        timeline.update(user.get("timeline", {}))
        annotations = user["annotations"] + annotations
    rs = RuleSet(markers=markers, levels=levels, timeline=timeline, annotations=annotations, rules=rules,
                 sources=sources)
    _check(rs)
    return rs


def _check(rs: RuleSet) -> None:
    seen = set()
    for r in rs.rules:
        if not r.evidence:
            r.evidence = rule_evidence(r)
        if r.id in seen:
            raise RulesError(f"rule id {r.id!r} is used twice")
        seen.add(r.id)
        for m in r.markers + r.not_markers + r.free_markers + r.free_not_markers + \
                ((r.freed_within,) if r.freed_within else ()):
            if m not in rs.markers:
                raise RulesError(f"rule {r.id}: unknown marker {m!r}")
        for m in r.stack_phase or ():
            if m != "none" and m not in rs.phase_markers:
                raise RulesError(f"rule {r.id}: stack_phase {m!r} is not a phase marker ({rs.phase_markers})")
    for m in rs.phase_markers:
        if m not in rs.markers:
            raise RulesError(f"phases.levels names unknown marker {m!r}")
        if m not in rs.timeline:
            raise RulesError(f"phases.timeline has no phase for marker {m!r}")

