"""EAGLE-3 as published against specexp's earlier variant, the distilled small LM and prompt lookup, on the
default target (issue 58).

  python benchmarks/eagle3_heads.py --earlier FOLDER [--prompts 8] [--head-prompts 32] [--max-new-tokens 64]

On MT-bench, greedy and T = 0.7, every prompt decoded by every method back to back in one process (the
order rotating per prompt), so ratios share the machine's drift. First every draft on --prompts prompts,
at K = 1 (its alpha: the chance its first token is accepted, comparable across drafts) and as a study runs
it (draft.k=auto, this machine's profile); then the two EAGLE-3 heads alone on --head-prompts prompts at
K = 1 and K = 3 (deeper draft steps, where the heads' training differs most). Each row: alpha, tau and
speedup over AR with their 95% intervals over prompts, c, the cost model's prediction and the decodes
identical to AR (greedy). The heads: `draft.head=eagle3` (the shipped head, EAGLE-3 as published:
experiment=distill_eagle3) and --earlier, a head of specexp's earlier variant (trained by the same recipe
with student=eagle3_fc; the one shipped as `eagle3` until 2026-12-07 is restored with
`git archive 30f7385 specexp/assets/eagle3-smollm2-135m | tar -x -C /tmp`); both with fp32 linears, so
their c compares.
"""

import argparse
from pathlib import Path

from common import decode_arguments, interleaved_summaries, report_header, study_draft, write_report

from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench
from specexp.models.embedded import load_embedded_target
from specexp.runtime import round_rows
from specexp.runtime.lean import LeanRuntime
from specexp.study.intervals import fmt_interval

PUBLISHED = ("eagle", ("draft.head=eagle3", "draft.quantize=null"))
OTHER_DRAFTS = {"distilled": ("distilled", ()), "prompt_lookup": ("prompt_lookup", ())}
SAMPLINGS = {"greedy": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7)}
COLUMNS = ["| sampling | method | alpha [95%] | tau [95%] | speedup [95%] | c | predicted | identical |",
           "|---|---|---|---|---|---|---|---|"]


def table_rows(target, prepared, prompt_count: int, drafts: dict, ks: tuple[str, ...], max_new: int) -> list[str]:
    """Every draft at every K of ``ks`` against AR on the first ``prompt_count`` MT-bench prompts, both samplings."""
    chosen = mt_bench(limit=prompt_count)
    encoded = encode_prompts(target.tokenizer, chosen, chat_template=True)
    rows = []
    for sampling_name, sampling in SAMPLINGS.items():
        methods, profile = {"ar": (None, 0)}, None
        for draft, (config, overrides) in drafts.items():
            for k in ks:
                drafter, k_max, policy, key, profile = study_draft(target, prepared.forward, prepared.record, config,
                                                                   encoded[0], (*overrides, f"draft.k={k}"), sampling)
                methods[f"{draft} K={k}"] = (drafter, k_max, policy, key)
        results = interleaved_summaries(target, chosen, encoded, methods, sampling, max_new, 0,
                                        desc=f"{sampling_name}, {prompt_count} prompts", forward=prepared.forward,
                                        profile=profile)
        for method, r in results.items():
            identical = f"{r['identical']}/{len(chosen)}" if sampling.greedy else "-"
            predicted = "-" if r.get("predicted_speedup") is None else f"{r['predicted_speedup']:.3f}"
            c = "-" if r.get("cost_ratio_c") is None else f"{r['cost_ratio_c']:.3f}"
            rows.append(f"| {sampling_name} | {method} | {fmt_interval(r['alpha'], r.get('alpha_ci95'))} | "
                        f"{fmt_interval(r['tau'], r.get('tau_ci95'))} | "
                        f"{fmt_interval(r['speedup'], r.get('speedup_ci95'))} | {c} | {predicted} | {identical} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--earlier", type=Path, required=True, help="a head folder of specexp's earlier variant")
    parser.add_argument("--head-prompts", type=int, default=32, help="prompts of the two heads' own comparison")
    args = decode_arguments(parser, Path(__file__).parent / "eagle3_heads.md").parse_args()
    if not (args.earlier / "eagle_head.json").is_file():
        parser.error(f"--earlier {args.earlier} is not a head folder of the earlier variant (no eagle_head.json)")
    heads = {"eagle3 (published)": PUBLISHED,
             "eagle3_fc (earlier variant)": ("eagle", (f"draft.head={args.earlier}", "draft.quantize=null"))}
    target = load_embedded_target()
    prepared = LeanRuntime().prepare(target, None, round_rows(1, 17))
    every_draft = table_rows(target, prepared, args.prompts, heads | OTHER_DRAFTS, ("1", "auto"), args.max_new_tokens)
    two_heads = table_rows(target, prepared, args.head_prompts, heads, ("1", "3"), args.max_new_tokens)
    lines = [*report_header("EAGLE-3 as published against the earlier variant, the distilled draft and prompt lookup"),
             f"The default target, MT-bench x {args.max_new_tokens} tokens, batch 1, one process, methods "
             "interleaved per prompt; intervals over prompts.", "",
             f"## Every draft ({args.prompts} prompts)", "", *COLUMNS, *every_draft, "",
             f"## The two EAGLE-3 heads ({args.head_prompts} prompts)", "", *COLUMNS, *two_heads]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
