"""Greedy parity of our runtime with HF `generate` on the default target (issue 18, item 5).

  python benchmarks/parity.py [--prompts 80] [--max-new-tokens 64] [--runtime lean|hf]

Every MT-bench question (first turn, chat template) is decoded greedily by our engine with a
study's runtime (default runtime=lean: the lean decoder, static cache and this machine's matmul
plan; runtime=hf: transformers' forward with the plan) and by HF `generate` with transformers'
own F.linear forward. Different matmul layouts round differently, so two fp32
decodes may part ways where the target's top two logits nearly tie; for every prompt that
differs the record shows the first differing position and the top-2 logit gap there (from HF's
forward over the common prefix).
"""

import argparse
import datetime
from pathlib import Path

import torch
from common import decode_hf, decode_ours, machine

from specexp.data import encode_prompts, mt_bench
from specexp.models.embedded import load_embedded_target
from specexp.runtime import HFRuntime, round_rows
from specexp.runtime.lean import LeanRuntime

RUNTIMES = {"lean": LeanRuntime, "hf": HFRuntime}


@torch.inference_mode()
def top2_gap(target, ids: list[int]) -> float:
    """The target's top-1 minus top-2 logit after ``ids`` (F.linear forward)."""
    top = target.model(torch.tensor([ids])).logits[0, -1].topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--runtime", choices=sorted(RUNTIMES), default="lean")
    parser.add_argument("--out", type=Path, help="default: parity.md (lean), parity_hf.md (hf)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    args.out = args.out or Path(__file__).with_name("parity.md" if args.runtime == "lean" else "parity_hf.md")

    reference, ours = load_embedded_target("float32", "cpu"), load_embedded_target("float32", "cpu")
    runtime = RUNTIMES[args.runtime]().prepare(ours, None, round_rows(1, 0))
    prompts = mt_bench(limit=args.prompts, seed=0)
    encoded = encode_prompts(reference.tokenizer, prompts)
    identical, rows = 0, []
    for prompt, ids in zip(prompts, encoded, strict=True):
        mine = decode_ours(ours, ids, None, args.max_new_tokens, runtime.forward).tokens[0]
        theirs, _ = decode_hf(reference, ids, args.max_new_tokens)
        if mine == theirs:
            identical += 1
            continue
        at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                  min(len(mine), len(theirs)))
        gap = top2_gap(reference, ids + theirs[:at]) if at < min(len(mine), len(theirs)) else float("nan")
        rows.append(f"| {prompt.id} | {prompt.category} | {at} | {gap:.4f} | {len(mine)} / {len(theirs)} |")
    lines = [f"# Greedy parity with HF generate ({datetime.date.today()})", "",
             f"Machine: {machine()}. Command: `python benchmarks/parity.py --prompts {args.prompts} "
             f"--max-new-tokens {args.max_new_tokens} --runtime {args.runtime}`. Ours: the engine with "
             f"runtime={args.runtime} (record: {runtime.record['name']}) and the matmul plan "
             f"(`{Path(runtime.record['plan_file']).name}`); HF: `generate(do_sample=False)` with F.linear.", "",
             f"**{identical} of {len(prompts)}** MT-bench questions decode to identical {args.max_new_tokens}-token "
             f"answers (EOS included)."]
    if rows:
        lines += ["", "Prompts that differ: the first differing position and the target's top-2 logit gap there "
                  "(a near-tie is a gap near 0).", "",
                  "| question | category | first difference at | top-2 logit gap | lengths ours / HF |",
                  "|---|---|---|---|---|", *rows]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
