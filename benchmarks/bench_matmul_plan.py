"""What the runtime's matmul plan (runtime.matmul_plan) does to the default target, in one process.

  python benchmarks/bench_matmul_plan.py [--prompts 8] [--max-new-tokens 64] [--max-n 17]

Two copies of the embedded SmolLM2-135M-Instruct (fp32), one with every Linear written as this
machine's plan chose (`specexp/runtime/matmul.py`), one with F.linear, measured side by side:
- the stream bandwidth (a sum over a tensor the size of the weights) and the floor it implies
  for one decoding step (weight bytes / bandwidth);
- T(n): one target pass over n new tokens after a 64-token prompt (the verify pass of a
  round with K = n - 1), median of repeats taken in turns, and T(n)/T(1);
- AR decoding through our engine (both copies) and HF `generate` (the F.linear copy), ms/token;
- the default study (MT-bench, greedy, batch 1) for prompt_lookup, distilled,
  distilled_confident and target_prefix against AR, on each copy (on the planned one the
  drafts' own fp32 models are planned too): alpha, verify cost, c, speedup.
"""

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch
from common import decode_hf, decode_ours, interleaved_summaries, machine, stream_bandwidth

from specexp.core.kv import RaggedKV
from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.small_lm import distilled_drafter, target_prefix_drafter
from specexp.models import load_embedded_target
from specexp.runtime import HFRuntime, round_rows


@torch.inference_mode()
def pass_times(models: dict, max_n: int, repeats: int) -> dict[str, list[float]]:
    """Median seconds of one pass over n = 1..max_n new tokens after a 64-token prompt, per model,
    the models and token counts taking turns."""
    prompt = torch.arange(100, 164)[None]
    caches = {}
    for name, model in models.items():
        caches[name] = RaggedKV.empty(model, 1, prompt.device)
        caches[name].forward(model, prompt, torch.ones_like(prompt))
    times = {name: {n: [] for n in range(1, max_n + 1)} for name in models}
    for _ in range(repeats):
        for n in range(1, max_n + 1):
            x = torch.arange(200, 200 + n)[None]
            for name, model in models.items():
                start = time.perf_counter()
                caches[name].forward(model, x, logits_to_keep=n)
                times[name][n].append(time.perf_counter() - start)
                caches[name].drop_last(torch.tensor([n]))
    return {name: [statistics.median(times[name][n]) for n in range(1, max_n + 1)] for name in models}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-n", type=int, default=17)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("matmul_plan.md"))
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    linear, planned = load_embedded_target("float32", "cpu"), load_embedded_target("float32", "cpu")
    record = HFRuntime().prepare(planned, None, round_rows(1, args.max_n - 1)).record  # as a study plans its target
    weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in linear.model.parameters()}.values())
    bandwidth = stream_bandwidth(weight_bytes)
    floor_ms = weight_bytes / bandwidth * 1e3
    lines = [f"# The matmul plan on the default target ({datetime.date.today()})", "",
             f"Machine: {machine()}. Command: `python benchmarks/bench_matmul_plan.py --prompts {args.prompts} "
             f"--max-new-tokens {args.max_new_tokens} --max-n {args.max_n}`. Plan file: "
             f"`{Path(record['plan_file']).name}`.", "",
             f"Stream bandwidth {bandwidth / 1e9:.1f} GB/s; the target's {weight_bytes / 1e6:.0f} MB of fp32 weights "
             f"put one decoding step's floor at {floor_ms:.1f} ms.", "",
             "Plan (weight shape: rows -> formulation): "
             + "; ".join(f"{k}: " + ", ".join(f"{m}:{c}" for m, c in v.items()) for k, v in record["choices"].items()), ""]

    times = pass_times({"F.linear": linear.model, "planned": planned.model}, args.max_n, args.repeats)
    lines += ["## T(n): one target pass over n new tokens (64-token context)", "",
              "| n | F.linear ms | T(n)/T(1) | planned ms | T(n)/T(1) |", "|---|---|---|---|---|"]
    for n in range(1, args.max_n + 1):
        a, b = times["F.linear"][n - 1], times["planned"][n - 1]
        lines.append(f"| {n} | {a * 1e3:.1f} | {a / times['F.linear'][0]:.2f} | {b * 1e3:.1f} | {b / times['planned'][0]:.2f} |")

    prompts = mt_bench(limit=args.prompts, seed=0)
    encoded = encode_prompts(linear.tokenizer, prompts)
    per_token = {"ours, F.linear": [], "ours, planned": [], "HF generate, F.linear": []}
    for ids in encoded:  # in turns, per prompt
        for name, target in (("ours, F.linear", linear), ("ours, planned", planned)):
            out = decode_ours(target, ids, None, args.max_new_tokens)
            per_token[name].append(out.total_s / len(out.tokens[0]))
        tokens, seconds = decode_hf(linear, ids, args.max_new_tokens)
        per_token["HF generate, F.linear"].append(seconds / len(tokens))
    lines += ["", f"## AR decoding, MT-bench ({args.prompts} prompts x {args.max_new_tokens} tokens, prefill included)",
              "", "| decoder | ms/token (median over prompts) | x floor |", "|---|---|---|"]
    for name, values in per_token.items():
        ms = statistics.median(values) * 1e3
        lines.append(f"| {name} | {ms:.1f} | {ms / floor_ms:.2f} |")

    lines += ["", "## The default study's drafts on each copy (MT-bench, greedy, batch 1)", "",
              "| copy | draft | alpha | verify cost | c | speedup over AR | identical to AR |", "|---|---|---|---|---|---|---|"]
    for copy_name, target in (("F.linear", linear), ("planned", planned)):
        methods = {"ar": (None, 0), "prompt_lookup K=4": (PromptLookupDrafter(target, k=4), 4),
                   "distilled K=1": (distilled_drafter(target, k=1), 1),
                   "distilled_confident K=2": (distilled_drafter(target, k=2, min_confidence=0.4), 2),
                   "target_prefix K=2": (target_prefix_drafter(target, n_layers=4, k=2), 2)}
        if copy_name == "planned":  # as a study does: the draft's own fp32 models follow the plan too
            for drafter, k in list(methods.values())[1:]:
                HFRuntime().prepare(target, drafter, round_rows(1, k))
        results = interleaved_summaries(target, prompts, encoded, methods, SamplingConfig(), args.max_new_tokens, 0,
                                        desc=copy_name)
        for name, s in results.items():
            c = "-" if s["cost_ratio_c"] is None else f"{s['cost_ratio_c']:.3f}"
            lines.append(f"| {copy_name} | {name} | {s['alpha']:.3f} | {s['verify_cost_ratio']:.2f} | {c} | "
                         f"{s['speedup']:.3f} | {s['identical']}/{len(prompts)} |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
