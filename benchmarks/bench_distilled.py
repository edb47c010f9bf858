"""The shipped distilled draft (draft=distilled) against prompt lookup and AR, per K.

  python benchmarks/bench_distilled.py [--prompts 16] [--max-new-tokens 64] [--ks 1 2 3 4 6]
      [--min-confidences 0 0.3] [--quantize none int8] [--draft FOLDER]

Default target, MT-bench (--prompts spread over its 8 categories), batch 1, greedy and
temperature 0.7. Per prompt the AR baseline, prompt_lookup (K=4) and the distilled draft at
each K and draft.min_confidence decode back to back, order rotating. Every metric is the
study's own (`summarize`): alpha, tau, c (draft seconds per drafted token / one AR step),
verify cost, speedup (tokens/s over AR on the same prompts), and the analytical prediction
with its optimal K.
"""

import argparse
import datetime
import json
from pathlib import Path

import torch
from common import interleaved_summaries, machine

from specexp.core import metrics
from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.small_lm import SmallLMDrafter, distilled_drafter
from specexp.models.embedded import load_embedded_target

SAMPLINGS = {"greedy": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7)}


def method_name(k: int, min_confidence: float, quantize: str | None) -> str:
    return (f"distilled K={k}" + (f", min_confidence {min_confidence:g}" if min_confidence else "")
            + (f", {quantize}" if quantize else ""))


def optimal_k(a: float, c: float, k_max: int = 16) -> int:
    """argmax_K of the analytical speedup (1 - a^(K+1)) / ((1 - a)(K c + 1))."""
    return max(range(1, k_max + 1), key=lambda k: metrics.predicted_speedup(a, k, c))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    parser.add_argument("--min-confidences", type=float, nargs="+", default=[0.0],
                        help="draft.min_confidence values (0 = always propose K tokens)")
    parser.add_argument("--quantize", nargs="+", default=["none"], choices=["none", "int8"],
                        help="draft.quantize values (none = the draft's fp32 weights)")
    parser.add_argument("--pl-k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft", type=Path, default=None,
                        help="a draft folder (python -m specexp.distill ... export_dir=FOLDER); "
                        "default: the shipped one")
    parser.add_argument("--work", type=Path, default=Path("outputs/bench_distilled"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("distilled_int8.md"))
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    prompts = mt_bench(limit=args.prompts, seed=args.seed)
    encoded = encode_prompts(target.tokenizer, prompts)
    methods = {"ar": (None, 0),
               f"prompt_lookup K={args.pl_k}": (PromptLookupDrafter(target, k=args.pl_k, max_n=3), args.pl_k)}
    def draft(k: int, min_confidence: float, quantize: str | None) -> SmallLMDrafter:
        if args.draft is None:
            return distilled_drafter(target, k=k, min_confidence=min_confidence, quantize=quantize)
        return SmallLMDrafter(target, str(args.draft), k=k, min_confidence=min_confidence, quantize=quantize)

    quantizes = [None if q == "none" else q for q in args.quantize]
    methods |= {method_name(k, t, q): (draft(k, t, q), k)
                for q in quantizes for t in args.min_confidences for k in args.ks}

    def decode(ids, drafter, sampling, max_new, seed):
        return generate(target.model, [ids], drafter, sampling, max_new, target.eos_token_ids,
                        torch.Generator().manual_seed(seed), target.pad_token_id)

    for drafter, _ in methods.values():  # warm-up
        decode(encoded[0], drafter, SAMPLINGS["greedy"], 4, 0)

    results = {}
    for sampling_name, sampling in SAMPLINGS.items():
        summaries = interleaved_summaries(target, prompts, encoded, methods, sampling, args.max_new_tokens, args.seed,
                                          sampling_name)
        results |= {(sampling_name, name): summary for name, summary in summaries.items()}

    report = render(results, args)
    print(report)
    args.out.write_text(report)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "results.json").write_text(json.dumps({f"{s} | {m}": v for (s, m), v in results.items()}, indent=1,
                                                       default=str))


def render(results: dict, args) -> str:
    draft = ("`draft=distilled` (specexp/assets/distilled-smollm2-135m, from `python -m specexp.distill "
             "experiment=distill_smollm2_tasks`)" if args.draft is None
             else f"`draft=small_lm draft.model={args.draft}`")
    command = (f"python benchmarks/bench_distilled.py --prompts {args.prompts} --max-new-tokens {args.max_new_tokens} "
               f"--ks {' '.join(map(str, args.ks))} "
               f"--min-confidences {' '.join(f'{t:g}' for t in args.min_confidences)}"
               f" --quantize {' '.join(args.quantize)}" + (f" --seed {args.seed}" if args.seed else "")
               + ("" if args.draft is None else f" --draft {args.draft}"))
    lines = [
        f"# The distilled draft for the default target ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {machine()}, fp32 (int8 rows: the draft's linears hold int8 weights, draft.quantize=int8). "
        f"Target: SmolLM2-135M-Instruct (embedded); draft: {draft}. "
        f"MT-bench, {args.prompts} prompts over its 8 categories, max_new_tokens={args.max_new_tokens}, batch 1. "
        f"Command: `{command}`.",
        "",
        "speedup = tokens/s over AR on the same prompts (totals; median per-prompt ratio in brackets); "
        "predicted = (1 - a^(K+1)) / ((1 - a)(Kc + 1)) from the measured alpha and c; "
        "opt K = its argmax; verify = seconds of a K+1-token target pass / one AR step. With a min_confidence "
        "the draft length adapts (a row stops before a token the draft gives less than that): alpha is over the tokens "
        "it did propose, c over its draft steps per proposed token (the step that found a doubtful token included), "
        "and the fixed-K prediction does not apply (-).",
        "",
        "| sampling | draft | alpha | tau | c | verify | speedup | predicted | opt K | identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (sampling, name), s in results.items():
        a, c = s["alpha"], s["cost_ratio_c"]
        adaptive = "min_confidence" in name
        opt = optimal_k(a, c) if a is not None and c and not adaptive else "-"
        predicted = "-" if adaptive else f"{s['predicted_speedup']:.2f}"
        same = f"{s['identical']}/{args.prompts}" if sampling == "greedy" else "n/a"
        lines.append(f"| {sampling} | {name} | {a:.3f} | {s['tau']:.2f} | {c:.3f} | {s['verify_cost_ratio']:.2f} | "
                     f"{s['speedup']:.3f} ({s['median_prompt_speedup']:.3f}) | {predicted} | {opt} | "
                     f"{same} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
