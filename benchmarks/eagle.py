"""Feature drafts (the shipped EAGLE-3 head, Medusa heads) against the other model drafts (issue 21).

  python benchmarks/eagle.py [--prompts 8] [--max-new-tokens 64] [--out benchmarks/eagle.md]

On MT-bench and Spec-Bench, greedy and T = 0.7: AR, then each shipped model draft at K = 1 (its
alpha: the chance its first token is accepted, comparable across drafts) and as a study runs it
(draft.k=auto; the feature drafts also as a dynamic tree, draft.tree=auto; the EAGLE-3 head
also with int8 linears, draft.quantize=int8, for its c), every prompt decoded
by every method back to back in one process (the order rotating per prompt), so ratios share
the machine's drift. Each row: alpha (accepted / drafted positions, a tree's by depth), tau
(tokens per target pass), accepted draft tokens per pass, c (draft seconds per drafted position
over an AR step), speedup over AR, the cost model's prediction (this machine's profile) and the
decodes identical to AR (greedy). Targets: the EAGLE head's alpha above every other model draft's
on MT-bench; the fastest model draft above 1.0x AR.
"""

import argparse
from pathlib import Path

from common import decode_arguments, interleaved_summaries, report_header, study_draft, write_report

from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench, spec_bench
from specexp.models.embedded import load_embedded_target
from specexp.runtime import round_rows
from specexp.runtime.lean import LeanRuntime

# name -> (draft config, overrides): the shipped heads; the shipped distilled draft and the fastest early exit
FEATURE_DRAFTS = {"eagle3": ("eagle", ("draft.head=eagle3", "draft.quantize=null")),  # fp32
                  "eagle3_int8": ("eagle", ("draft.head=eagle3", "draft.quantize=int8")),  # c with int8 linears
                  "medusa": ("medusa", ())}
AS_TREES = ("eagle3", "medusa")  # also drafted as dynamic trees
OTHER_DRAFTS = {"distilled": ("distilled", ()),
                "early_exit_L12": ("early_exit", ("draft.head=trained", "draft.exit_layer=12", "draft.mode=shared"))}
SAMPLINGS = {"greedy": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7)}
TREE_BRANCHES = 2


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def methods_of(draft: str, overrides: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    methods = {f"{draft} K=1": (*overrides, "draft.k=1"), f"{draft} K=auto": (*overrides, "draft.k=auto")}
    if draft in AS_TREES:
        methods[f"{draft} tree=auto"] = (*overrides, "draft.tree=auto", f"draft.branches={TREE_BRANCHES}",
                                         "draft.k_max=8")
    return methods


def tables(prompts: int, max_new_tokens: int) -> tuple[list[str], list[str]]:
    target = load_embedded_target()
    prepared = LeanRuntime().prepare(target, None, round_rows(1, 17))
    rows = ["| data | sampling | method | alpha | tau | accepted / pass | c | speedup | predicted | identical |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = ["| data | sampling | best alpha (K=1) | best other model draft's alpha (K=1) | fastest (speedup) |",
                "|---|---|---|---|---|"]
    for data_name, loader in (("mt_bench", mt_bench), ("spec_bench", spec_bench)):
        chosen = loader(limit=prompts)
        encoded = encode_prompts(target.tokenizer, chosen, chat_template=True)
        for sampling_name, sampling in SAMPLINGS.items():
            methods, profile = {"ar": (None, 0)}, None
            for draft, (config, overrides) in (FEATURE_DRAFTS | OTHER_DRAFTS).items():
                for name, method in methods_of(draft, overrides).items():
                    drafter, k, policy, key, profile = study_draft(target, prepared.forward, prepared.record, config,
                                                                   encoded[0], method, sampling)
                    methods[name] = (drafter, k, policy, key)
            # one profile file per machine and setting: the last one read holds every draft's entry
            results = interleaved_summaries(target, chosen, encoded, methods, sampling, max_new_tokens, 0,
                                            desc=f"{data_name} {sampling_name}", forward=prepared.forward,
                                            profile=profile)
            for method, r in results.items():
                identical = f"{r['identical']}/{len(chosen)}" if sampling.greedy else "-"
                rows.append(f"| {data_name} | {sampling_name} | {method} | {fmt(r['alpha'])} | {fmt(r['tau'])} | "
                            f"{fmt(r['accepted_per_pass'])} | {fmt(r['cost_ratio_c'])} | {fmt(r['speedup'])} | "
                            f"{fmt(r['predicted_speedup'])} | {identical} |")
            alpha = {m: r["alpha"] or 0.0 for m, r in results.items() if m.endswith("K=1")}
            feature = max((m for m in alpha if m.split()[0] in FEATURE_DRAFTS), key=alpha.get)
            other = max((m for m in alpha if m.split()[0] not in FEATURE_DRAFTS), key=alpha.get)
            fastest = max(results, key=lambda m: results[m]["speedup"])
            verdicts.append(f"| {data_name} | {sampling_name} | {feature} ({alpha[feature]:.3f}) | {other} "
                            f"({alpha[other]:.3f}) | {fastest} ({results[fastest]['speedup']:.3f}) |")
    return rows, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = decode_arguments(parser, Path(__file__).parent / "eagle.md").parse_args()
    rows, verdicts = tables(args.prompts, args.max_new_tokens)
    lines = [*report_header("Feature drafts (EAGLE-3, Medusa) against the other model drafts"),
             f"{args.prompts} prompts x {args.max_new_tokens} tokens per set, batch 1, one process, methods "
             "interleaved per prompt.", "", "## Verdicts", "", *verdicts, "", "## Every method", "", *rows]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
