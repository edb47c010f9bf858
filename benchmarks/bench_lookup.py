"""Prompt-lookup cost per round at a long context, against one target pass there.

  python benchmarks/bench_lookup.py [--context 8192] [--k 4] [--rounds 200]

Builds an 8k-token context from Spec-Bench text, times (a) one round of our incremental
index (extend with the committed tokens + lookup, median over --rounds) and a full
rescan of the context (numpy sliding windows, HF's approach) for comparison, and (b) one
target pass over K+1 tokens with an 8k-token KV cache (median of 5). Prints the ratios.
"""

import argparse
import datetime
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from common import machine
from numpy.lib.stride_tricks import sliding_window_view

from specexp.core.kv import RaggedKV
from specexp.data import SPEC_BENCH_FILE, question_jsonl
from specexp.drafts.parts.context_index import ContextIndex
from specexp.models.embedded import load_embedded_target


def rescan(seq: np.ndarray, max_n: int, k: int) -> np.ndarray:
    """A full scan of the context per round, for comparison."""
    for n in range(max_n, 0, -1):
        hits = np.flatnonzero((sliding_window_view(seq[:-1], n) == seq[-n:]).all(1))
        if len(hits):
            return seq[hits[-1] + n : hits[-1] + n + k]
    return seq[:0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--spec-bench", default=str(SPEC_BENCH_FILE),
                        help="a Spec-Bench question.jsonl (default: the copy in the package)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("lookup.md"))
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    target = load_embedded_target("float32", "cpu")
    text = "\n".join(p.text for p in question_jsonl(args.spec_bench))
    tokens = target.tokenizer(text)["input_ids"][: args.context + args.rounds * (args.k + 1)]

    index = ContextIndex(max_n=3, min_n=1)
    index.extend(tokens[: args.context])
    index_s, rescan_s, pos = [], [], args.context
    for _ in range(args.rounds):
        committed = tokens[pos : pos + args.k + 1]  # a round commits up to K+1 tokens
        start = time.perf_counter()
        index.extend(committed)
        index.lookup(args.k)
        index_s.append(time.perf_counter() - start)
        pos += len(committed)
        seq = np.asarray(tokens[:pos])
        start = time.perf_counter()
        rescan(seq, 3, args.k)
        rescan_s.append(time.perf_counter() - start)

    kv = RaggedKV.empty(target.model, 1, torch.device("cpu"))
    kv.forward(target.model, torch.tensor([tokens[: args.context - args.k - 1]]))  # fill the cache to ~8k
    pass_s = []
    for _ in range(5):
        start = time.perf_counter()
        kv.forward(target.model, torch.tensor([tokens[: args.k + 1]]), logits_to_keep=args.k + 1)
        pass_s.append(time.perf_counter() - start)
        kv.drop_last(torch.tensor([args.k + 1]))
    index_ms, rescan_ms, pass_ms = (1e3 * statistics.median(x) for x in (index_s, rescan_s, pass_s))
    report = "\n".join([
        f"# Prompt-lookup cost at a {args.context}-token context ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {machine()}, fp32, target SmolLM2-135M-Instruct. Command: `python benchmarks/bench_lookup.py "
        f"--context {args.context} --k {args.k} --rounds {args.rounds}`. Medians.",
        "",
        "| per round | ms | share of one target pass (K+1 tokens, 8k cache) |",
        "|---|---|---|",
        f"| incremental index (extend + lookup) | {index_ms:.4f} | {index_ms / pass_ms:.4%} |",
        f"| full rescan (numpy sliding windows) | {rescan_ms:.3f} | {rescan_ms / pass_ms:.3%} |",
        f"| target pass | {pass_ms:.1f} | 100% |",
        "",
    ])
    print(report)
    args.out.write_text(report)


if __name__ == "__main__":
    main()
