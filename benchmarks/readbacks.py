"""Host readbacks per round, per draft kind: how often a round makes the host wait for the device.

Each case builds a draft config as `python -m specexp draft=NAME OVERRIDES` does, for the embedded
default target under the study's runtime, and decodes a batch of MT-bench prompts while
`specexp.core.readbacks.ReadbackCounter` counts every read of a tensor's values (a device
synchronisation on a GPU; on this CPU they cost nothing, but they are the same reads). Rounds are
split where the engine's `decode_round` is entered (the script wraps it, so a tree without
`round_started` is measured alike). draft.k=auto runs the cost model's policy at prices under which
drafting pays (the count does not depend on the prices, only on what the policy reads).

    python benchmarks/readbacks.py [--json OUT.json] [--before OLD.json]

``--json`` writes the table as JSON; ``--before`` adds the column of such a file, written by this
script on another tree (the counter module copied into it): the readbacks per round before a change.
"""

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import torch
from common import report_header, write_report
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from specexp.core import engine
from specexp.core.readbacks import ReadbackCounter
from specexp.data import encode_prompts
from specexp.drafts.build import resolve_draft_k
from specexp.k_policy.priced import PricedK
from specexp.k_policy.tree import PricedTreeK
from specexp.paths import CONFIG_DIR
from specexp.runtime import round_rows
from specexp.study.references import greedy_continuations

SAMPLED = "sampling.temperature=0.7"
# (draft config, its overrides, the study's sampling override or None for greedy)
CASES = [
    ("none", (), None),
    ("prompt_lookup", ("draft.k=4",), None),
    ("prompt_lookup", ("draft.k=auto",), None),
    ("prompt_lookup", ("draft.k=4",), SAMPLED),
    ("prompt_lookup", ("draft.k=6", "draft.branches=2"), None),
    ("target_prefix", ("draft.k=4",), None),
    ("target_prefix", ("draft.k=4",), SAMPLED),
    ("target_prefix", ("draft.k=auto",), None),
    ("target_prefix", ("draft.k=6", "draft.branches=2"), None),
    ("distilled", ("draft.k=2",), None),
    ("distilled", ("draft.k=auto",), SAMPLED),
    ("distilled_confident", ("draft.k=2",), None),
    ("oracle", ("draft.k=4", "draft.alpha=0.8"), None),
    ("eagle", ("draft.k=4",), None),
    ("eagle", ("draft.k=4",), SAMPLED),
    ("eagle", ("draft.k=auto",), None),
    ("eagle", ("draft.k=6", "draft.branches=2"), None),
    ("medusa", ("draft.k=3",), None),
    ("early_exit", ("draft.k=2",), None),
    ("ngram_lm", ("draft.k=4",), None),
]


def compose_case(name: str, overrides: tuple[str, ...], sampling: str | None):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=[f"draft={name}", *overrides, *([sampling] if sampling else [])])


def paying_policy(drafter, k_max: int):
    """draft.k=auto's policy at prices under which drafting pays."""
    seconds = 0.02 * (1 + 0.05 * np.arange(k_max + 1))
    draft_seconds = np.r_[0.0, np.full(k_max, 1e-4)]
    if drafter.traits.grows_trees:
        return PricedTreeK(lambda context: seconds, draft_seconds)
    return PricedK(lambda context: seconds, draft_seconds, free_groups=drafter.traits.proposal_groups)


def counted_decode(forward, target, encoded, drafter, sampling, max_new: int, policy) -> tuple[list[int], dict]:
    """Readbacks of each round of one decode of the batch, and the lines that asked."""
    starts, original = [], engine.decode_round

    def marked(*args, **kwargs):
        starts.append(len(counter))
        return original(*args, **kwargs)

    with ReadbackCounter() as counter:
        engine.decode_round = marked
        try:
            engine.generate(forward, encoded, drafter, sampling, max_new, target.eos_token_ids,
                            torch.Generator(target.model.device).manual_seed(0), target.pad_token_id, k_policy=policy)
        finally:
            engine.decode_round = original
    ends = [*starts[1:], len(counter)]
    return [end - start for start, end in zip(starts, ends, strict=True)], counter.where()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2, help="MT-bench prompts decoded as one batch")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None, help="also write the table here (JSON)")
    parser.add_argument("--before", type=Path, default=None, help="a --json file of another tree: its column beside")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("readbacks.md"))
    args = parser.parse_args()
    base = compose_case("none", (), None)
    target = instantiate(base.target)
    prompts = instantiate(base.data)[: args.prompts]
    encoded = encode_prompts(target.tokenizer, prompts, chat_template=base.chat_template)
    rows = []
    for name, overrides, sampled in CASES:
        cfg = compose_case(name, overrides, sampled)
        draft_cfg, policy_name = resolve_draft_k(cfg.draft)
        drafter = instantiate(draft_cfg)(target)
        k_max = drafter.traits.k_max
        prepared = instantiate(cfg.runtime).prepare(target, drafter, round_rows(len(encoded), k_max))
        if drafter.traits.needs_reference:
            drafter.set_reference(encoded, greedy_continuations(prepared.forward, target, encoded, args.max_new_tokens,
                                                                len(encoded)))
        sampling = instantiate(cfg.sampling)
        policy = paying_policy(drafter, k_max) if policy_name == "auto" else None
        per_round, where = counted_decode(prepared.forward, target, encoded, drafter if k_max else None, sampling,
                                          args.max_new_tokens, policy)
        case = " ".join([f"draft={name}", *overrides, *([sampled] if sampled else [])])
        rows.append({"case": case, "rounds": len(per_round), "mean": statistics.mean(per_round),
                     "max": max(per_round), "where": sorted(where.items(), key=lambda item: -item[1])[:3]})
        print(json.dumps(rows[-1]))
    before = {row["case"]: row for row in json.loads(args.before.read_text())} if args.before else {}
    lines = report_header("Host readbacks per round, per draft kind")
    lines += [f"A batch of {len(encoded)} MT-bench prompts, {args.max_new_tokens} new tokens, the embedded default "
              "target under the study's runtime; a readback is any read of a tensor's values on the host.", ""]
    head = "| case | rounds | readbacks per round (mean) | most in a round |"
    if before:
        head += " before: mean | before: most |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        line = f"| `{row['case']}` | {row['rounds']} | {row['mean']:.2f} | {row['max']} |"
        if before:
            old = before.get(row["case"])
            line += f" {old['mean']:.2f} | {old['max']} |" if old else " | |"
        lines.append(line)
    lines += ["", "## Where the readbacks of each case came from (the three lines that asked most)", ""]
    for row in rows:
        lines.append(f"- `{row['case']}`: " + "; ".join(f"`{where}` x{n}" for where, n in row["where"]))
    if before:
        lines += ["", "Before:", ""]
        for row in before.values():
            lines.append(f"- `{row['case']}`: " + "; ".join(f"`{where}` x{n}" for where, n in row["where"]))
    write_report(args.out, lines)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
