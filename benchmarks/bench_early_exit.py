"""Early-exit self-speculation (draft=early_exit) against AR and HF's `assistant_early_exit`.

  python benchmarks/bench_early_exit.py [--prompts 8] [--max-new-tokens 48] [--layers 6 12 18] [--ks 1 2 4]

Default target, MT-bench (--prompts over its 8 categories), batch 1, greedy. For each exit layer
L: our drafter at each K with the untrained head (the target's own norm + LM head) and the
trained head shipped for L, each in shared mode (drafting writes layers 0..L-1's KV into the
target's cache; verification runs only the rest) and naive mode (a separate draft cache; the
target pass recomputes every layer), and HF `generate(assistant_early_exit=L)` with its default
candidate schedule. Per prompt all of one L decode back to back, order rotating. Metrics are the
study's own (`summarize`): alpha, tau, c, verify cost, speedup (tokens/s over AR on the same
prompts); "saved" is naive's seconds per committed token over shared's, same head and K.
"""

import argparse
import contextlib
import datetime
import json
import statistics
from pathlib import Path

import torch
from common import decode_hf, interleaved_summaries, machine
from tqdm import tqdm

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench
from specexp.drafts.early_exit import early_exit_drafter
from specexp.models.embedded import load_embedded_target
from specexp.reporting.plots import optimal_k

GREEDY = SamplingConfig()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 12, 18])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("outputs/bench_early_exit"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("early_exit.md"))
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    prompts = mt_bench(limit=args.prompts, seed=args.seed)
    encoded = encode_prompts(target.tokenizer, prompts)
    results, hf = {}, {}
    for layer in args.layers:
        methods = {"ar": (None, 0)}
        for head in ("untrained", "trained"):
            for k in args.ks:
                for mode in ("shared", "naive"):
                    methods[f"{head} K={k} {mode}"] = (early_exit_drafter(target, layer, k, head, mode), k)
        for drafter, _ in methods.values():  # warm-up
            generate(target.model, [encoded[0]], drafter, GREEDY, 4, target.eos_token_ids)
        summaries = interleaved_summaries(target, prompts, encoded, methods, GREEDY, args.max_new_tokens, args.seed,
                                          f"L={layer}")
        results |= {(layer, name): s for name, s in summaries.items()}
        hf[layer] = hf_early_exit(target, encoded, layer, args.max_new_tokens)

    report = render(results, hf, args)
    print(report)
    args.out.write_text(report)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "results.json").write_text(json.dumps({f"L={l} | {m}": v for (l, m), v in results.items()} | {
        f"L={l} | hf": v for l, v in hf.items()}, indent=1, default=str))


# HF's early-exit assistant is the target itself and reads its candidate settings from the
# target's own generation_config (not from generate's kwargs), so variants set them there.
HF_VARIANTS = {"HF default": {}, "HF K=1": {"num_assistant_tokens": 1, "num_assistant_tokens_schedule": "constant"}}


@contextlib.contextmanager
def generation_settings(model, **settings):
    config = model.generation_config
    saved = {key: getattr(config, key, None) for key in settings}
    for key, value in settings.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def hf_early_exit(target, encoded: list[list[int]], layer: int, max_new: int) -> dict[str, dict]:
    """HF's assistant_early_exit=L (its default candidate settings, and one candidate per round)
    against HF's own greedy generate, interleaved per prompt with the order rotating."""
    names = [*HF_VARIANTS, "ar"]

    def decode(name: str, ids: list[int], n: int) -> tuple[list[int], float]:
        if name == "ar":
            return decode_hf(target, ids, n)
        with generation_settings(target.model, **HF_VARIANTS[name]):
            return decode_hf(target, ids, n, assistant_early_exit=layer)

    for name in names:  # warm-up
        decode(name, encoded[0], 4)
    done = {name: [] for name in names}  # per prompt: (tokens, seconds)
    for i, ids in enumerate(tqdm(encoded, desc=f"HF L={layer}")):
        for name in names[i % len(names):] + names[: i % len(names)]:
            done[name].append(decode(name, ids, max_new))
    ar_tps = sum(len(t) for t, _ in done["ar"]) / sum(s for _, s in done["ar"])
    results = {}
    for name in HF_VARIANTS:
        tps = sum(len(t) for t, _ in done[name]) / sum(s for _, s in done[name])
        ratios = [len(t) / s / (len(at) / a_s) for (t, s), (at, a_s) in zip(done[name], done["ar"], strict=True)]
        results[name] = {"speedup": tps / ar_tps, "median_prompt_speedup": statistics.median(ratios),
                         "identical": sum(t == at for (t, _), (at, _) in zip(done[name], done["ar"], strict=True))}
    return results


def render(results: dict, hf: dict, args) -> str:
    lines = [
        f"# Early-exit self-speculation on the default target ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {machine()}, fp32. Target: SmolLM2-135M-Instruct (embedded, 30 layers). MT-bench, "
        f"{args.prompts} prompts over its 8 categories, max_new_tokens={args.max_new_tokens}, batch 1, greedy. "
        f"Trained heads: specexp/assets/exit-heads-smollm2-135m (`bash experiments/distill_exit_heads.sh`). "
        f"Command: `python benchmarks/bench_early_exit.py --prompts {args.prompts} --max-new-tokens "
        f"{args.max_new_tokens} --layers {' '.join(map(str, args.layers))} --ks {' '.join(map(str, args.ks))}`.",
        "",
        "speedup = tokens/s over AR on the same prompts (totals; median per-prompt ratio in brackets); "
        "c = draft seconds per drafted token / one AR step; verify = seconds of the round's target pass / one AR step "
        "(shared mode: layers 0..L-1 for x_K + layers L..N-1 for K+1 positions); saved = naive's seconds per token / "
        "shared's (same head, K); predicted = (1 - a^(K+1)) / ((1 - a)(Kc + 1)), opt K = its argmax; "
        "HF = `generate(assistant_early_exit=L)` over HF's own greedy generate, with its default candidate schedule "
        "and with `num_assistant_tokens=1` (constant).",
        "",
        "| L | head | K | mode | alpha | tau | c | verify | speedup | saved | predicted | opt K | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (layer, name), s in results.items():
        head, k, mode = name.split()
        a, c = s["alpha"], s["cost_ratio_c"]
        saved = "-"
        if mode == "shared":
            naive = results[(layer, f"{head} {k} naive")]
            saved = f"{s['speedup'] / naive['speedup']:.3f}"
        lines.append(f"| {layer} | {head} | {k[2:]} | {mode} | {a:.3f} | {s['tau']:.2f} | {c:.3f} | "
                     f"{s['verify_cost_ratio']:.2f} | {s['speedup']:.3f} ({s['median_prompt_speedup']:.3f}) | "
                     f"{saved} | {s['predicted_speedup']:.2f} | {optimal_k(a, c) if a is not None and c else '-'} | "
                     f"{s['identical']}/{args.prompts} |")
    for layer, variants in hf.items():
        for name, s in variants.items():
            lines.append(f"| {layer} | untrained | {name} | HF | - | - | - | - | {s['speedup']:.3f} "
                         f"({s['median_prompt_speedup']:.3f}) | - | - | - | {s['identical']}/{args.prompts} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
