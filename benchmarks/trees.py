"""Token trees against chains, per draft (issue 20).

  python benchmarks/trees.py [--prompts 8] [--max-new-tokens 64] [--out benchmarks/trees.md]

On MT-bench and Spec-Bench, greedy and T = 0.7, for the shipped distilled draft (dynamic trees,
EAGLE-2 style) and prompt lookup (earlier matches' continuations as branches): AR, chains at
K = 1..4 and trees of several (branches, node budget), every prompt decoded by every method back
to back in one process (the order rotating per prompt), so ratios share the machine's drift.
Each row: tokens per target pass (tau), accepted draft tokens per pass, speedup over AR, the cost
model's prediction (this machine's profile, per-position acceptance by proposal length), and
the decodes identical to AR (greedy). Targets: accepted tokens per pass +30% over the same
draft's best chain; the best tree draft faster than the best chain draft. (The "Reading" and
tree_sweep sections of benchmarks/trees.md are added by hand after a run.)
"""

import argparse
from pathlib import Path

from common import decode_arguments, interleaved_summaries, report_header, study_draft, write_report

from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench, spec_bench
from specexp.models.embedded import load_embedded_target
from specexp.runtime import round_rows
from specexp.runtime.lean import LeanRuntime

CHAINS = (1, 2, 3, 4)
# (branches, node budget): passes of up to 4 tokens cost ~1.05 T(1) on the 2-core CPU, 5 tokens 1.45
TREES = ((2, 2), (2, 3), (3, 3), (2, 4), (4, 8))
AUTO_BRANCHES = 2  # a dynamic tree whose node budget draft.k=auto chooses per round (model drafts)
DRAFTS = ("distilled", "prompt_lookup")
SAMPLINGS = {"greedy": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7)}


def method_overrides(draft: str) -> dict[str, tuple[str, ...]]:
    chains = {f"chain K={k}": (f"draft.k={k}",) for k in CHAINS}
    trees = {f"tree b={b} N={n}": (f"draft.k={n}", f"draft.branches={b}") for b, n in TREES}
    auto = {} if draft == "prompt_lookup" else {  # a trie takes a fixed budget
        f"tree b={AUTO_BRANCHES} N=auto": ("draft.k=auto", f"draft.branches={AUTO_BRANCHES}")}
    return chains | trees | auto


def tables(prompts: int, max_new_tokens: int) -> tuple[list[str], list[str]]:
    target = load_embedded_target()
    prepared = LeanRuntime().prepare(target, None, round_rows(1, 17))
    rows = ["| data | sampling | draft | method | tau | accepted / pass | nodes / pass | speedup | predicted | "
            "identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = ["| data | sampling | draft | best chain (accepted/pass, speedup) | most accepted tree "
                "(accepted/pass, speedup) | accepted +% | fastest tree (speedup) | fastest tree / best chain |",
                "|---|---|---|---|---|---|---|---|"]
    for data_name, loader in (("mt_bench", mt_bench), ("spec_bench", spec_bench)):
        chosen = loader(limit=prompts)
        encoded = encode_prompts(target.tokenizer, chosen, chat_template=True)
        for sampling_name, sampling in SAMPLINGS.items():
            for draft in DRAFTS:
                methods, profile = {"ar": (None, 0)}, None
                for name, overrides in method_overrides(draft).items():
                    drafter, k, policy, key, profile = study_draft(target, prepared.forward, prepared.record, draft,
                                                                   encoded[0], overrides, sampling)
                    methods[name] = (drafter, k, policy, key)
                results = interleaved_summaries(target, chosen, encoded, methods, sampling, max_new_tokens, 0,
                                                desc=f"{data_name} {sampling_name} {draft}", forward=prepared.forward,
                                                profile=profile)
                for name, r in results.items():
                    identical = f"{r['identical']}/{len(chosen)}" if sampling.greedy else "-"
                    label = f"{name} (mean N {r['mean_k']:.2f})" if name.endswith("auto") else name
                    rows.append(f"| {data_name} | {sampling_name} | {draft} | {label} | {r['tau']:.3f} | "
                                f"{r['accepted_per_pass']:.3f} | {r['nodes_per_pass']:.2f} | {r['speedup']:.3f} | "
                                f"{r['predicted_speedup']:.3f} | {identical} |")
                chains = {n: r for n, r in results.items() if n.startswith("chain")}
                trees = {n: r for n, r in results.items() if n.startswith("tree")}
                best_chain = max(chains, key=lambda n: chains[n]["speedup"])
                most = max(trees, key=lambda n: trees[n]["accepted_per_pass"])
                fastest = max(trees, key=lambda n: trees[n]["speedup"])
                bc, mt, ft = chains[best_chain], trees[most], trees[fastest]
                verdicts.append(
                    f"| {data_name} | {sampling_name} | {draft} | {best_chain} ({bc['accepted_per_pass']:.3f}, "
                    f"{bc['speedup']:.3f}) | {most} ({mt['accepted_per_pass']:.3f}, {mt['speedup']:.3f}) | "
                    f"{100 * (mt['accepted_per_pass'] / max(bc['accepted_per_pass'], 1e-9) - 1):+.0f}% | {fastest} "
                    f"({ft['speedup']:.3f}) | {ft['speedup'] / bc['speedup']:.3f} |")
    return rows, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = decode_arguments(parser, Path(__file__).parent / "trees.md").parse_args()
    rows, verdicts = tables(args.prompts, args.max_new_tokens)
    lines = [*report_header("Token trees against chains"),
             f"{args.prompts} prompts x {args.max_new_tokens} tokens per set, batch 1, one process, methods "
             "interleaved per prompt. accepted / pass: draft tokens accepted per target pass "
             "(a tree's: its accepted path).", "",
             "## Per draft: the best chain (by speed) against its trees", "", *verdicts, "",
             "## Every method", "", *rows]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
