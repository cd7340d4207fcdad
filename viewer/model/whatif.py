"""The What-if panel's questions, put to `classifiers.whatif.what_if` (no Qt here).

The panel computes nothing of its own: the combined factors, the scaled peak, its type and
whether it fits a GPU are `what_if`'s answer (the `WhatIf` result `vramscope whatif`
prints); which levers cannot apply to the run, and why, is `services.whatif.levers_left_out`
(the rule the report's what-if section follows). What this keeps is what `what_if` lets a
caller keep between questions: the per-category model and the budget of one device, built
once, on the worker (`WhatIfSession.build`), then a question per slider move (`ask`: about
a millisecond at 10^6 events).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...classifiers import Analysis
from ...classifiers.budget import Budget
from ...classifiers.budget import budget as make_budget
from ...classifiers.category_live import CategoryLive
from ...classifiers.levers import LEVERS, Pulled, describe
from ...classifiers.whatif import WhatIf, run_family, what_if
from ...parsers import Progress
from ...services.whatif import levers_left_out


@dataclass
class WhatIfSession:
    analysis: Analysis
    device: int
    model: CategoryLive              # per-category live bytes over the run (what_if's model)
    budget: Budget                   # the napkin-math budget beside the measurement
    levers: dict[str, Pulled]        # every named lever: what it does on this run, its band for runs like it
    left_out: dict[str, str]         # {lever: why it cannot apply to this run}

    @classmethod
    def build(cls, analysis: Analysis, device: int, progress: Progress | None = None) -> WhatIfSession:
        """The models of one device (0.1 s at 10^6 events, 0.9 s at 10^7): on the worker."""
        if progress is not None:
            progress.start("per-category model", 2.0)
        da = analysis.devices[device]
        model = CategoryLive.build(da)
        if progress is not None:
            progress.update(1.0)
            progress.check()
        bud = make_budget(analysis, device, model=model)
        if progress is not None:
            progress.update(2.0)
        facts = bud.facts
        family = run_family(da)
        return cls(analysis, device, model, bud, {name: describe(name, facts, family) for name in LEVERS},
                   levers_left_out(analysis, device))

    @property
    def categories(self) -> tuple[str, ...]:
        """The categories this run has (a slider each)."""
        return self.model.categories

    def ask(self, sliders: dict[str, float], levers: list[str], gpu=None, fit: str | None = None) -> WhatIf:
        """`what_if` for these slider factors, ticked levers and GPU size (a number of GiB or
        a size in words: '24', '80GB'), and with `fit` (needs a GPU) how far that dimension
        could grow with them; raises WhatIfError for a size it cannot read."""
        return what_if(self.analysis, self.device, sliders, levers, gpu, model=self.model, budget=self.budget,
                       fit=fit if gpu is not None else None, fit_each=False)


__all__ = ["WhatIfSession"]
