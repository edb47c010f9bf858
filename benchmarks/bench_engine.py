"""Engine vs Hugging Face, measured side by side in one process on the same prompts.

  python benchmarks/bench_engine.py [--prompts 8] [--max-new-tokens 64] [--k 4] [--repeats 2]

Each comparison decodes every prompt with both sides back to back (order alternating,
after a warm-up of each), greedy, --repeats times, and reports the median of the
per-prompt tokens/s ratios plus the ratio of the totals. Outputs must be token-identical.
Then the default study (`python -m specexp`'s config) runs once and its realized speedup is
set against the analytical prediction. The markdown report goes to stdout and to --out.
"""

import argparse
import datetime
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from common import decode_hf, decode_ours, machine
from hydra import compose, initialize_config_dir

from specexp.data import encode_prompts, mt_bench
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.models import LoadedModel, first_layers
from specexp.models.embedded import load_embedded_target
from specexp.paths import CONFIG_DIR
from specexp.study.run import run_from_config


@dataclass
class Comparison:
    name: str
    ours_tokens: list[int]
    ours_s: list[float]
    hf_tokens: list[int]
    hf_s: list[float]
    identical: list[bool]

    def ratios(self) -> list[float]:
        sides = zip(self.ours_tokens, self.ours_s, self.hf_tokens, self.hf_s, strict=True)
        return [(o / o_s) / (h / h_s) for o, o_s, h, h_s in sides]

    def row(self) -> str:
        ours_tps = sum(self.ours_tokens) / sum(self.ours_s)
        hf_tps = sum(self.hf_tokens) / sum(self.hf_s)
        return (f"| {self.name} | {ours_tps:.2f} | {hf_tps:.2f} | {statistics.median(self.ratios()):.3f} | "
                f"{ours_tps / hf_tps:.3f} | {sum(self.identical)}/{len(self.identical)} |")


def ours(target: LoadedModel, ids: list[int], drafter, max_new: int) -> tuple[list[int], float]:
    out = decode_ours(target, ids, drafter, max_new)
    return out.tokens[0], out.total_s


def compare(name: str, target, encoded, max_new: int, drafter, hf_kwargs: dict, repeats: int) -> Comparison:
    ours(target, encoded[0], drafter, 8)  # warm-up both sides
    decode_hf(target, encoded[0], 8, **hf_kwargs)
    c = Comparison(name, [], [], [], [], [])
    for i, ids in enumerate(encoded * repeats):
        order = ("ours", "hf") if i % 2 == 0 else ("hf", "ours")
        results = {side: ours(target, ids, drafter, max_new) if side == "ours"
                   else decode_hf(target, ids, max_new, **hf_kwargs) for side in order}
        (o_tok, o_s), (h_tok, h_s) = results["ours"], results["hf"]
        # HF keeps the EOS token it stopped on, like our engine: lengths are comparable.
        c.ours_tokens.append(len(o_tok))
        c.ours_s.append(o_s)
        c.hf_tokens.append(len(h_tok))
        c.hf_s.append(h_s)
        c.identical.append(o_tok == h_tok)
    return c


def default_study() -> dict:
    """The default study's config, run once into a temporary folder; returns its summary."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config")
    with tempfile.TemporaryDirectory() as out:
        return run_from_config(cfg, Path(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-n", type=int, default=3)
    parser.add_argument("--draft-layers", type=int, default=4, help="small_lm draft = the target's first N layers")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts per comparison")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("engine.md"))
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    prompts = mt_bench(limit=args.prompts, seed=0)
    encoded = encode_prompts(target.tokenizer, prompts)
    draft = first_layers(target, args.draft_layers)
    # HF's assistant with the same fixed K and no early stop, so both sides draft the same way.
    draft.model.generation_config.num_assistant_tokens = args.k
    draft.model.generation_config.num_assistant_tokens_schedule = "constant"
    draft.model.generation_config.assistant_confidence_threshold = 0.0

    comparisons = [
        compare("AR baseline vs generate()", target, encoded, args.max_new_tokens, None, {}, args.repeats),
        # HF's lookup rule (earliest match, K tokens after any match): the same proposals on both sides.
        compare(f"prompt_lookup K={args.k} (HF's rule) vs generate(prompt_lookup_num_tokens={args.k})", target, encoded,
                args.max_new_tokens, PromptLookupDrafter(target, k=args.k, max_n=args.max_n, choice="first",
                                                         max_tokens_after_match=[]),
                {"prompt_lookup_num_tokens": args.k, "max_matching_ngram_size": args.max_n}, args.repeats),
        compare(f"small_lm (first {args.draft_layers} layers) K={args.k} vs generate(assistant_model=)", target,
                encoded, args.max_new_tokens, SmallLMDrafter(target, draft, k=args.k), {"assistant_model": draft.model},
                args.repeats),
    ]
    study = default_study()
    lines = [
        f"# Engine vs Hugging Face generate ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {machine()}, fp32. Target: {target.name}. MT-bench, {len(encoded)} prompts (one per category), "
        f"greedy, max_new_tokens={args.max_new_tokens}, batch 1. Command: `python benchmarks/bench_engine.py "
        f"--prompts {args.prompts} --max-new-tokens {args.max_new_tokens} --k {args.k} --repeats {args.repeats}`.",
        "",
        "| comparison | ours tok/s | HF tok/s | median per-prompt ratio | total ratio | identical outputs |",
        "|---|---|---|---|---|---|",
        *[c.row() for c in comparisons],
        "",
        "Ratios are ours / HF tokens per second, each prompt timed back to back (order alternating).",
        "",
        "## The default study (`python -m specexp`)",
        "",
        "| alpha | tau | c | verify cost | speedup | predicted | realized / predicted | greedy_match |",
        "|---|---|---|---|---|---|---|---|",
        f"| {study['alpha']:.3f} | {study['tau']:.3f} | {study['cost_ratio_c']:.4f} | "
        f"{study['verify_cost_ratio']:.3f} | {study['speedup']:.3f} | {study['predicted_speedup']:.3f} | "
        f"{study['realized_over_predicted']:.3f} | {study['greedy_match']:.1f} |",
        "",
        "The prediction prices a verify pass over K+1 tokens like one AR step; `verify cost` is "
        "what it measured here.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    args.out.write_text(report)


if __name__ == "__main__":
    main()
