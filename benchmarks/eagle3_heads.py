"""EAGLE-3 as published against specexp's earlier variant, the distilled small LM and prompt lookup, on the
default target (issue 58).

  python benchmarks/eagle3_heads.py [--prompts 8] [--max-new-tokens 64]

On MT-bench, greedy and T = 0.7: AR and each draft at K = 1 (its alpha: the chance its first token is
accepted, comparable across drafts) and as a study runs it (draft.k=auto, this machine's profile), every
prompt decoded by every method back to back in one process (the order rotating per prompt), so ratios share
the machine's drift. Each row: alpha, tau and speedup over AR with their 95% intervals over prompts, c, the
cost model's prediction and the decodes identical to AR (greedy). The heads: `draft.head=eagle3` (the shipped
head, EAGLE-3 as published: experiment=distill_eagle3) and `draft.head=eagle3_fc` (the earlier variant,
trained by the same recipe with student=eagle3_fc); both with fp32 linears, so their c compares.
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

# name -> (draft config, overrides)
DRAFTS = {"eagle3 (published)": ("eagle", ("draft.head=eagle3", "draft.quantize=null")),
          "eagle3_fc (earlier variant)": ("eagle", ("draft.head=eagle3_fc", "draft.quantize=null")),
          "distilled": ("distilled", ()),
          "prompt_lookup": ("prompt_lookup", ())}
SAMPLINGS = {"greedy": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = decode_arguments(parser, Path(__file__).parent / "eagle3_heads.md").parse_args()
    target = load_embedded_target()
    prepared = LeanRuntime().prepare(target, None, round_rows(1, 17))
    chosen = mt_bench(limit=args.prompts)
    encoded = encode_prompts(target.tokenizer, chosen, chat_template=True)
    rows = ["| sampling | method | alpha [95%] | tau [95%] | speedup [95%] | c | predicted | identical |",
            "|---|---|---|---|---|---|---|---|"]
    for sampling_name, sampling in SAMPLINGS.items():
        methods, profile = {"ar": (None, 0)}, None
        for draft, (config, overrides) in DRAFTS.items():
            for k in ("1", "auto"):
                drafter, k_max, policy, key, profile = study_draft(target, prepared.forward, prepared.record, config,
                                                                   encoded[0], (*overrides, f"draft.k={k}"), sampling)
                methods[f"{draft} K={k}"] = (drafter, k_max, policy, key)
        results = interleaved_summaries(target, chosen, encoded, methods, sampling, args.max_new_tokens, 0,
                                        desc=sampling_name, forward=prepared.forward, profile=profile)
        for method, r in results.items():
            identical = f"{r['identical']}/{len(chosen)}" if sampling.greedy else "-"
            predicted = "-" if r.get("predicted_speedup") is None else f"{r['predicted_speedup']:.3f}"
            c = "-" if r.get("cost_ratio_c") is None else f"{r['cost_ratio_c']:.3f}"
            rows.append(f"| {sampling_name} | {method} | {fmt_interval(r['alpha'], r.get('alpha_ci95'))} | "
                        f"{fmt_interval(r['tau'], r.get('tau_ci95'))} | "
                        f"{fmt_interval(r['speedup'], r.get('speedup_ci95'))} | {c} | {predicted} | {identical} |")
    lines = [*report_header("EAGLE-3 as published against the earlier variant, the distilled draft and prompt lookup"),
             f"The default target, {args.prompts} MT-bench prompts x {args.max_new_tokens} tokens, batch 1, "
             "one process, methods interleaved per prompt; intervals over prompts.", "", *rows]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
