"""The cost model against what it measures, and draft.k=auto against fixed K (issue 19).

  python benchmarks/cost_model.py --sweeps multirun/k_sweep multirun/draft_compare multirun/model_check \
      [--auto] [--prompts 8] [--max-new-tokens 64] [--out benchmarks/cost_model.md]

1. For every job of the finished sweeps: the measured speedup, the cost model's prediction
   (per-position acceptance by proposal length + this machine's profile), Leviathan's i.i.d.
   prediction, and realized/predicted; how many jobs fall within [0.9, 1.1].
2. With --auto, on MT-bench and Spec-Bench, for each shipped draft: AR, fixed K = 1, 2, 3, 4, 6,
   draft.k=auto and HF's heuristic schedule decoded in one process, every prompt by every method
   back to back (the order rotating), so the ratios share the machine's drift: auto against the
   best fixed K of the same run.
"""

import argparse
from pathlib import Path

from common import decode_arguments, interleaved_summaries, report_header, study_draft, write_report

from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench, spec_bench
from specexp.models.embedded import load_embedded_target
from specexp.reporting.job_table import collect
from specexp.runtime import round_rows
from specexp.runtime.lean import LeanRuntime

FIXED_KS = (1, 2, 3, 4, 6)
DRAFTS = ("prompt_lookup", "distilled", "distilled_confident", "target_prefix")


def sweep_table(paths: list[Path]) -> list[str]:
    table = collect(paths)
    table = table[table["status"] == "ok"]
    lines = ["| sweep | job | speedup | predicted (cost model) | realized / predicted | predicted (i.i.d.) |",
             "|---|---|---|---|---|---|"]
    for row in table.itertuples():
        sweep = Path(row.path).parent.name
        iid = getattr(row, "predicted_speedup_iid", None)
        lines.append(f"| {sweep} | {row.job} | {row.speedup:.3f} | {row.predicted_speedup:.3f} | "
                     f"{row.realized_over_predicted:.3f} | {iid:.3f} |")
    ratio = table["realized_over_predicted"]
    within = int(((ratio >= 0.9) & (ratio <= 1.1)).sum())
    return [f"{within} of {len(table)} jobs within [0.9, 1.1]; realized/predicted from {ratio.min():.3f} to "
            f"{ratio.max():.3f} (median {ratio.median():.3f}).", "", *lines]


def auto_table(prompts: int, max_new_tokens: int) -> list[str]:
    target = load_embedded_target()
    prepared = LeanRuntime().prepare(target, None, round_rows(1, 8))
    lines = ["| data | draft | " + " | ".join(f"K={k}" for k in FIXED_KS) + " | auto (mean K) | heuristic | "
             "auto / best fixed | identical |", "|---|---|" + "---|" * (len(FIXED_KS) + 4)]
    for data_name, loader in (("mt_bench", mt_bench), ("spec_bench", spec_bench)):
        chosen = loader(limit=prompts)
        encoded = encode_prompts(target.tokenizer, chosen, chat_template=True)
        for draft in DRAFTS:
            methods, profile = {"ar": (None, 0)}, None
            for k in (*FIXED_KS, "auto", "heuristic"):
                drafter, k_max, policy, key, profile = study_draft(target, prepared.forward, prepared.record, draft,
                                                                   encoded[0], (f"draft.k={k}",))
                LeanRuntime().prepare(target, drafter, round_rows(1, k_max))  # as a study plans its draft
                methods[str(k)] = (drafter, k_max, policy, key)
            results = interleaved_summaries(target, chosen, encoded, methods, SamplingConfig(), max_new_tokens, 0,
                                            desc=f"{data_name} {draft}", forward=prepared.forward, profile=profile)
            fixed = {k: results[str(k)]["speedup"] for k in FIXED_KS}
            best = max(fixed, key=fixed.get)
            auto = results["auto"]
            identical = min(r["identical"] for r in results.values())
            lines.append(f"| {data_name} | {draft} | " + " | ".join(
                f"**{fixed[k]:.3f}**" if k == best else f"{fixed[k]:.3f}" for k in FIXED_KS)
                + f" | {auto['speedup']:.3f} ({auto['mean_k']:.2f}) | {results['heuristic']['speedup']:.3f} | "
                f"{auto['speedup'] / fixed[best]:.3f} | {identical}/{len(chosen)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", nargs="*", type=Path, default=[])
    parser.add_argument("--auto", action="store_true", help="also run the draft.k=auto benchmark (~15 min)")
    args = decode_arguments(parser, Path(__file__).parent / "cost_model.md").parse_args()
    lines = report_header("The cost model, measured")
    if args.sweeps:
        lines += ["## Realized against predicted, every job of the sweeps", "", *sweep_table(args.sweeps), ""]
        args.out.write_text("\n".join(lines) + "\n")
    if args.auto:
        lines += [f"## draft.k=auto against fixed K ({args.prompts} prompts x {args.max_new_tokens} tokens per set, "
                  "greedy, batch 1, one process, methods interleaved per prompt)", "", *auto_table(
                      args.prompts, args.max_new_tokens)]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
