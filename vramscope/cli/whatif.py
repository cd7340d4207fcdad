"""`vramscope whatif FILE [--scale CATEGORY=FACTOR]... [--lever NAME]... [--gpu SIZE] [--fit batch|seq]
[--lora-rank N]`."""
from __future__ import annotations

from ..classifiers.levers import LEVERS, TARGETS_DEFAULT, LeverError, parse_targets
from ..services.reporters import JsonReporter, Reporter, TextReporter
from .common import add_input, add_json, analyze_file, check_device, emit
from .errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("whatif", help="what would fit: the budget, and the peak with categories scaled or levers pulled",
                       description="Recompute the peak over the whole recorded run with categories' live bytes "
                                   "scaled (exact for the factors), for named levers (estimates, each stated), and "
                                   "say whether it fits a GPU; with the napkin-math budget against the measurement.")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--scale", action="append", default=[], metavar="CATEGORY=FACTOR",
                   help="scale a category's live bytes, e.g. activations=0.5 (repeatable)")
    p.add_argument("--lever", action="append", default=[], metavar="NAME", choices=list(LEVERS),
                   help=f"a named change: {', '.join(LEVERS)} (repeatable; checkpointing, no_checkpointing, "
                        f"half_batch and lora are simulated on the recorded timeline)")
    p.add_argument("--gpu", metavar="SIZE", help="a GPU size to fit on: 24, 24GiB, 80GB")
    p.add_argument("--fit", choices=("batch", "seq"),
                   help="with --gpu: the largest micro-batch (or sequence) multiple that fits, alone and with each "
                        "lever that applies")
    p.add_argument("--lora-rank", type=int, default=8, metavar="N",
                   help="rank of the adapters the lora lever simulates (default 8)")
    p.add_argument("--lora-targets", default=TARGETS_DEFAULT, metavar="TARGETS",
                   help="which matrices the lora lever puts adapters on: all-linear (default, as peft's "
                        "all-linear), attention, q,v, or module names (q_proj,v_proj,gate_proj,...)")
    add_json(p, help="print one JSON object")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..classifiers.whatif import parse_gpu_size, parse_scale
    from ..services.whatif import whatif_document, whatif_text
    reporters: dict[str, Reporter[dict]] = {"text": TextReporter(whatif_text), "json": JsonReporter()}
    try:
        scales: dict[str, float] = {}
        for text in args.scale:
            cat, f = parse_scale(text)
            scales[cat] = scales.get(cat, 1.0) * f
        if args.gpu is not None:
            parse_gpu_size(args.gpu)
        if args.fit is not None and args.gpu is None:
            raise LeverError(f"--fit {args.fit} needs --gpu SIZE (the card to fit on)")
        if args.lora_rank < 1:
            raise LeverError(f"--lora-rank must be at least 1, not {args.lora_rank}")
        targets = parse_targets(args.lora_targets)
    except LeverError as e:
        raise UsageError(str(e)) from None
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    try:
        doc = whatif_document(an, scales, args.lever, args.gpu, args.device, fit=args.fit,
                              lora_rank=args.lora_rank, lora_targets=targets)
    except LeverError as e:
        raise UsageError(str(e)) from None
    return emit(reporters[args.format], doc)
