"""What every lever is (one object per lever, one file each in this package) and what pulling one
on a run gives.

A lever knows, in one place: whether it applies to this run (`why_not`, from the run's facts,
classifiers/runfacts.py), what it does (simulated levers rewrite the recorded timeline,
`apply`; the others are estimates, `factors`), its assumption in words, and the error band
measured against runs recorded with it pulled, per family of runs (`bands`). Advice, OOM
findings, the report, the viewer and `whatif` all ask the lever; the saving any of them shows
is the lever's simulated peak difference (an estimate is labelled as one).
"""
from __future__ import annotations

from dataclasses import dataclass, field


class LeverError(ValueError):
    """An unknown lever name, or a lever option that makes no sense (one-line message)."""


@dataclass(frozen=True)
class Band:
    """How far a lever's predicted peak was from the peak of runs recorded with it pulled, as a
    share of the recorded peak: signed (predicted - recorded), mean and the worst each way."""
    mean: float
    worst_under: float          # the most negative error (predicted too low: the risky side), <= 0
    worst_over: float           # the most positive error, >= 0
    cases: int
    families: tuple = ()        # the families the cases come from

    @property
    def worst(self) -> float:
        return max(-self.worst_under, self.worst_over)

    @property
    def leans_low(self) -> bool:
        """Most of its error is on the low side (a prediction that says 'fits' too soon)."""
        return self.mean < 0 and -self.worst_under > self.worst_over

    def to_json(self) -> dict:
        return {"mean": self.mean, "worst_under": self.worst_under, "worst_over": self.worst_over,
                "worst": self.worst, "cases": self.cases, "families": list(self.families)}


@dataclass(frozen=True)
class Measured:
    """One family's measurement of one lever (benchmarks/whatif_accuracy.py --bands prints these)."""
    family: str                 # e.g. "tiny GPT (CPU grid)", "Llama, SwiGLU, tied embeddings"
    kind: str                   # the family's run kind (Family.key): "transformer/fp32/full", ...
    mean: float
    worst_under: float
    worst_over: float
    cases: int


@dataclass(frozen=True)
class Family:
    """What a run is, as far as a lever's measured band cares: the kind of blocks (transformer,
    cnn, mlp, none), the precision (fp32 or autocast) and whether adapters train."""
    blocks: str
    precision: str
    adapters: bool

    @property
    def key(self) -> str:
        return f"{self.blocks}/{self.precision}/{'lora' if self.adapters else 'full'}"

    def words(self) -> str:
        return (f"{self.blocks} blocks, {'16-bit autocast' if self.precision == 'autocast' else self.precision}, "
                f"{'LoRA adapters' if self.adapters else 'full training'}")


def band_for(measured: tuple, family: Family | None) -> tuple[Band | None, str]:
    """(the band of the measurements of runs like `family`, what was decided in words): a band
    only where the run resembles families the lever was measured on (same blocks, precision
    and adapters); else None and the nearest family measured."""
    if not measured:
        return None, "not measured: no recorded run with this lever pulled"
    if family is None:
        return None, "not validated for this kind of run (its blocks could not be told)"
    like = [m for m in measured if m.kind == family.key]
    if not like:
        near = max(measured, key=lambda m: (m.kind.split("/")[0] == family.blocks,
                                            m.kind.split("/")[1] == family.precision, m.cases))
        return None, (f"not validated for this kind of run ({family.words()}); nearest measured: {near.family} "
                      f"(worst {100 * max(-near.worst_under, near.worst_over):.1f}%)")
    n = sum(m.cases for m in like)
    mean = sum(m.mean * m.cases for m in like) / n
    band = Band(round(mean, 6), round(min(m.worst_under for m in like), 6), round(max(m.worst_over for m in like), 6),
                n, tuple(m.family for m in like))
    return band, f"measured on runs like this one ({family.words()}): {families_words(band.families)}"


def families_words(families) -> str:
    """'bert_dropout, CPU dev', 'bert_dropout, H100 dev', 'tiny GPT (CPU grid)' ->
    'bert_dropout (CPU dev, H100 dev), tiny GPT (CPU grid)'."""
    where: dict[str, list[str]] = {}
    for f in families:
        name, _, set_ = str(f).partition(", ")
        where.setdefault(name, [])
        if set_:
            where[name].append(set_)
    return ", ".join(f"{n} ({', '.join(w)})" if w else n for n, w in where.items())


@dataclass(frozen=True)
class Pulled:
    """One lever on one run: whether it was applied, what it assumed, how sure it is."""
    name: str
    title: str
    simulated: bool             # simulated on the recorded timeline (else an estimate from factors)
    applied: bool               # False: the run does not support it; `why` says why, and no prediction is made
    why: str                    # why it was not applied, and what would make it work ('' when applied)
    assumption: str             # what it rests on, in words
    scales: dict = field(default_factory=dict)     # {category: factor} of an estimate
    removes_overhead: bool = False                 # drops the allocator's reserved-but-unallocated memory
    error_band: Band | None = None                 # only where measured on runs like this one
    band_note: str = ""                            # how that was decided, or why there is none

    @property
    def estimate(self) -> bool:
        return not self.simulated

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "simulated": self.simulated, "estimate": self.estimate,
                "applied": self.applied, "why": self.why, "scales": dict(self.scales),
                "removes_overhead": self.removes_overhead, "assumption": self.assumption,
                "error_band": self.error_band.to_json() if self.error_band is not None and self.applied else None,
                "band_note": self.band_note}


@dataclass(frozen=True)
class Applied:
    """What a simulated lever did to the rewritten run (simulate.py)."""
    name: str
    applied: bool               # False: the run does not support it (the reason in `assumption`)
    assumption: str


class Lever:
    """One lever. Subclasses set the class attributes and override what they do."""
    name: str = ""
    title: str = ""
    simulated: bool = False
    summary: str = ""           # what a simulated lever does, in a line (an estimate says it in `factors`)
    training: bool = False      # acts on training (gradients, optimizer state): needs a backward and a step
    measured: tuple = ()        # Measured per family (benchmarks/whatif_accuracy.py)

    def why_not(self, run, expandable: bool = False) -> str | None:
        """Why this lever cannot apply to this run (None: it can), from the run's facts."""
        return None

    def factors(self, facts) -> tuple[dict, bool, str]:
        """An estimate's (scales {category: factor}, removes the allocator overhead, assumption)."""
        return {}, False, ""

    def apply(self, rw, ctx) -> Applied:
        """A simulated lever: rewrite the run (simulate.Rewrite); `ctx`: simulate.Context."""
        raise NotImplementedError

    def band(self, family: Family | None) -> tuple[Band | None, str]:
        return band_for(self.measured, family)


__all__ = ["Band", "Measured", "Family", "Pulled", "Applied", "Lever", "LeverError", "band_for"]
