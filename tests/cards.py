"""The cards of ../shared/snapshots/cards: what each real run was, read from the script that
wrote it, and the claims that would be wrong for it. `python tests/cards.py` prints, for every
card, the facts vramscope gets wrong and the forbidden claims it makes; tests/test_cards.py
asserts the same.

A card's facts are about the run; `devices[].run` says what the trace shows. The mapping:

  card                      devices[].run (primary device)
  trace_recorded            recorded == "trace"
  backward_in_trace         backward
  optimizer_step_in_trace   optimizer_step
  oom_in_trace              oom
  checkpointing             checkpointing
  lora                      adapters
  weights_quantized         quantized ("none" = false)
  autocast                  autocast ("none" = false; else the dtype)
  models_alive              models_alive
  kind                      kind (training / forward_backward / inference / forward_with_grad)

A fact the trace cannot decide is null in `run`; it is only wrong where the card decides it
and the trace could (`decidable`: a trace with frames for the phase facts).
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from helpers import SHARED  # noqa: E402
from vramscope.common.jsonio import dumps  # noqa: E402

CARDS = SHARED / "cards"

KIND = {"training": "training", "forward_backward_no_optimizer": "forward_backward", "inference": "inference",
        "forward_with_grad_no_backward": "forward_with_grad"}


def cards() -> list[dict]:
    out = []
    for p in sorted(CARDS.glob("*.json")) if CARDS.is_dir() else []:
        d = json.loads(p.read_text())
        d["path"] = SHARED / d["file"]
        out.append(d)
    return out


def texts(path) -> dict[str, str]:
    """What a user reads about the file: `summary`, `whatif` (plain and with --gpu 24 --fit batch) and
    report.md, made by the functions the command line calls."""
    from vramscope.cli.common import analyze_file
    from vramscope.services.report import write_report
    from vramscope.services.summary import summary_document, summary_text
    from vramscope.services.whatif import whatif_document, whatif_text
    an = analyze_file(str(path), True, None)
    out = {"summary": summary_text(summary_document(an))}
    out["summary_json"] = dumps(summary_document(an)).decode()     # (the command line's writer)
    out["whatif"] = whatif_text(whatif_document(an, {}, [], None, None))
    if an.devices:
        out["whatif_fit"] = whatif_text(whatif_document(an, {}, [], "24", None, fit="batch"))
    with tempfile.TemporaryDirectory() as d:
        write_report(an, d)
        out["report"] = Path(d, "report.md").read_text()
    return out


def forbidden(card: dict, txt: dict[str, str]) -> list[str]:
    """The card's must_not_say claims found in what the user reads: 'surface: claim: the line'."""
    out = []
    for m in card.get("must_not_say", []):
        rx = re.compile(m["regex"], re.IGNORECASE)
        for surface, t in txt.items():
            if surface == "summary_json":
                continue
            hit = rx.search(t)
            if hit:
                line = t[t.rfind("\n", 0, hit.start()) + 1:t.find("\n", hit.end()) if "\n" in t[hit.end():] else None]
                out.append(f"{surface}: {m['claim']}: {line.strip()[:200]}")
    return out


def run_facts(doc: dict) -> dict | None:
    devs = doc.get("devices") or []
    return devs[0].get("run") if devs else None


def wrong_facts(card: dict, run: dict | None) -> list[str]:
    """Facts the card decides that `run` (devices[0].run of summary --json) contradicts."""
    f = card["facts"]
    if run is None:
        return [] if not f.get("trace_recorded") else ["no devices[].run"]
    out = []

    def val(name):
        v = run.get(name)
        return v.get("value") if isinstance(v, dict) else None

    def check(name, want, got, may_be_unknown=True):
        if want is None:
            return
        if got is None and may_be_unknown:
            return
        if got != want:
            out.append(f"{name}: card {want!r}, vramscope {got!r}")

    trace = f.get("trace_recorded")
    if trace is not None:
        check("recorded", bool(trace), val("recorded") == "trace", False)
    # with a trace that has frames, the phases must be decided
    decided = val("recorded") == "trace"
    check("backward", f.get("backward_in_trace"), val("backward"), not decided)
    check("optimizer_step", f.get("optimizer_step_in_trace"), val("optimizer_step"), not decided)
    check("oom", f.get("oom_in_trace") if trace else None, val("oom"))
    check("checkpointing", f.get("checkpointing"), val("checkpointing"))
    check("adapters", f.get("lora"), val("adapters"))
    q = f.get("weights_quantized")
    if q is not None:
        got = val("quantized")
        if got is not None and bool(got) != (q != "none"):
            out.append(f"quantized: card {q!r}, vramscope {got!r}")
    ac = f.get("autocast")
    if ac is not None:
        got = val("autocast")
        if got is not None and (bool(got) != (ac != "none") or (ac != "none" and got not in (True, ac))):
            out.append(f"autocast: card {ac!r}, vramscope {got!r}")
    # the card counts resident copies of a model as models; vramscope says one model, held twice
    models = val("models_alive")
    if models == 1 and val("model_held_twice") and f.get("models_alive") == 2:
        models = 2
    check("models_alive", f.get("models_alive"), models)
    k = KIND.get(f.get("kind"))
    got = val("kind")
    # a training script whose trace stops before its backward shows a forward with grad: the trace's kind
    if k is not None and got is not None and got != "unknown":
        ok = got == k or (k == "training" and not f.get("backward_in_trace") and got == "forward_with_grad")
        if not ok:
            out.append(f"kind: card {f.get('kind')!r}, vramscope {got!r}")
    return out


def main() -> int:
    total_f = total_w = 0
    for card in cards():
        if not card["path"].exists():
            continue
        txt = texts(card["path"])
        run = run_facts(json.loads(txt["summary_json"]))
        bad = forbidden(card, txt)
        wrong = wrong_facts(card, run)
        total_f += len(bad)
        total_w += len(wrong)
        print(f"== {card['file']}: {len(wrong)} wrong facts, {len(bad)} forbidden claims")
        for w in wrong:
            print("   fact   ", w)
        for b in bad:
            print("   claim  ", b)
    print(f"total: {total_w} wrong facts, {total_f} forbidden claims")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
