"""The n-gram draft family on Spec-Bench: per task group alpha, tau and speedup.

  python benchmarks/bench_ngram.py [--per-group 8] [--max-new-tokens 64] [--k 4]

Spec-Bench's six task groups (its 80 MT-bench questions form "multi_turn"), --per-group
evaluation prompts each, default target, greedy. The corpus of ngram_lm and retrieval is
disjoint from them: the target's own answers to --corpus-per-group other questions per
group, plus the text of every non-evaluation question. Per prompt, the AR baseline, our
prompt_lookup (as configured, and uncapped = HF's proposals) / ngram_lm / retrieval, and HF
generate(prompt_lookup_num_tokens=K) decode back to back (order rotating).
Speedups are against our AR baseline on the same prompt.
"""

import argparse
import datetime
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from common import decode_hf, decode_ours, machine
from tqdm import tqdm

from specexp.core import metrics
from specexp.core.kv import RaggedKV
from specexp.core.sampling import SamplingConfig
from specexp.data import SPEC_BENCH_FILE, encode_prompts, question_jsonl
from specexp.draft_vocab import vocab_fingerprint
from specexp.drafts.ngram_lm import NgramLMDrafter
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.retrieval import RetrievalDrafter
from specexp.models.embedded import load_embedded_target
from specexp.ngram.corpus import generated_documents, join_documents
from specexp.ngram.datastore import SuffixDatastore
from specexp.ngram.kneser_ney import KneserNeyLM

MT_BENCH_CATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
OURS = ("prompt_lookup", "prompt_lookup_uncapped", "ngram_lm", "retrieval")


def task_group(category: str) -> str:
    return "multi_turn" if category in MT_BENCH_CATEGORIES else category


def split_prompts(path: str, per_group: int, corpus_per_group: int, seed: int):
    by_group = defaultdict(list)
    for prompt in question_jsonl(path):
        by_group[task_group(prompt.category)].append(prompt)
    rng = np.random.default_rng(seed)
    evaluation, corpus_answers, corpus_texts = [], [], []
    for group in sorted(by_group):
        prompts = [by_group[group][i] for i in rng.permutation(len(by_group[group]))]
        evaluation += prompts[:per_group]
        corpus_answers += prompts[per_group : per_group + corpus_per_group]
        corpus_texts += prompts[per_group:]
    return evaluation, corpus_answers, corpus_texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec-bench", default=str(SPEC_BENCH_FILE),
                        help="a Spec-Bench question.jsonl (default: the copy in the package)")
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--corpus-per-group", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--order", type=int, default=5)
    parser.add_argument("--min-confidence", type=float, default=0.3, help="of ngram_lm and retrieval")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("outputs/bench_ngram"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("ngram.md"))
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    evaluation, corpus_answers, corpus_texts = split_prompts(args.spec_bench, args.per_group, args.corpus_per_group,
                                                             args.seed)
    # The corpus: the target's answers to held-out questions, plus the held-out question texts.
    documents = generated_documents(target, corpus_answers, 128, SamplingConfig(temperature=0.7), batch_size=6)
    documents += [target.tokenizer(p.text)["input_ids"] for p in corpus_texts]
    fingerprint, eos = vocab_fingerprint(target), target.eos_token_ids[0]
    args.work.mkdir(parents=True, exist_ok=True)
    KneserNeyLM.build(join_documents(documents, eos), args.order, target.vocab_size,
                      fingerprint).save(args.work / "lm.npz")
    SuffixDatastore.build(documents, target.vocab_size, fingerprint).save(args.work / "store.npz")
    corpus_tokens = sum(len(d) for d in documents)

    drafters = {
        "prompt_lookup": PromptLookupDrafter(target, k=args.k, max_n=3),  # draft=prompt_lookup's defaults
        # HF's proposals token for token (earliest match, K tokens after any match): isolates the engine
        "prompt_lookup_uncapped": PromptLookupDrafter(target, k=args.k, max_n=3, choice="first",
                                                      max_tokens_after_match=[]),
        "ngram_lm": NgramLMDrafter(target, str(args.work / "lm.npz"), k=args.k, min_confidence=args.min_confidence),
        "retrieval": RetrievalDrafter(target, str(args.work / "store.npz"), k=args.k,
                                      min_confidence=args.min_confidence),
    }
    hf_kwargs = {"prompt_lookup_num_tokens": args.k, "max_matching_ngram_size": 3}
    encoded = encode_prompts(target.tokenizer, evaluation)
    for drafter in [None, *drafters.values()]:  # warm-up
        decode_ours(target, encoded[0], drafter, 4)
    decode_hf(target, encoded[0], 4, **hf_kwargs)

    rows = []  # one per (prompt, method)
    methods = ["ar", *OURS, "hf_prompt_lookup"]
    for i, (prompt, ids) in enumerate(tqdm(list(zip(evaluation, encoded, strict=True)), desc="prompts")):
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        outputs = {}
        for method in order:
            if method == "hf_prompt_lookup":
                tokens, seconds = decode_hf(target, ids, args.max_new_tokens, **hf_kwargs)
                outputs[method] = {"tokens": tokens, "seconds": seconds}
            else:
                out = decode_ours(target, ids, drafters.get(method), args.max_new_tokens)
                active = out.active
                outputs[method] = {"tokens": out.tokens[0], "seconds": out.total_s,
                                   "proposed": out.n_proposed[active].numpy(),
                                   "accepted": out.n_accepted[active].numpy(), "emitted": out.n_emitted[active].numpy()}
        for method, o in outputs.items():
            rows.append({"group": task_group(prompt.category), "prompt": prompt.id, "method": method, **o,
                         "identical": o["tokens"] == outputs["ar"]["tokens"]})

    costs = pass_cost(target, encoded[len(encoded) // 2], args.k)
    report = render(rows, args, corpus_tokens, len(documents), costs)
    print(report)
    args.out.write_text(report)
    (args.work / "rows.json").write_text(json.dumps(
        [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()} for r in rows]))


@torch.inference_mode()
def pass_cost(target, ids: list[int], k: int, repeats: int = 15) -> dict[int, float]:
    """Seconds of one target pass over T = 1..k+1 new tokens after ``ids`` (median, T interleaved),
    through the engine's own cache: what verifying T-1 draft tokens costs."""
    kv = RaggedKV.empty(target.model, 1, target.model.device)
    kv.forward(target.model, torch.tensor([ids]))
    seconds = defaultdict(list)
    for _ in range(repeats):
        for T in range(1, k + 2):
            start = time.perf_counter()
            kv.forward(target.model, torch.tensor([ids[:T]]), logits_to_keep=T)
            seconds[T].append(time.perf_counter() - start)
            kv.drop_last(torch.tensor([T]))
    return {T: statistics.median(v) for T, v in seconds.items()}


def render(rows: list[dict], args, corpus_tokens: int, corpus_docs: int, costs: dict[int, float]) -> str:
    groups = sorted({r["group"] for r in rows})
    by = defaultdict(list)
    for r in rows:
        by[(r["group"], r["method"])].append(r)
        by[("all", r["method"])].append(r)

    def tps(rs):
        return sum(len(r["tokens"]) for r in rs) / sum(r["seconds"] for r in rs)

    def per_prompt_ratio(method, base, group):
        a = {r["prompt"]: len(r["tokens"]) / r["seconds"] for r in by[(group, method)]}
        b = {r["prompt"]: len(r["tokens"]) / r["seconds"] for r in by[(group, base)]}
        return statistics.median(a[p] / b[p] for p in a)

    lines = [
        f"# n-gram drafts on Spec-Bench ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {machine()}, fp32. Target: SmolLM2-135M-Instruct (embedded). Greedy, K={args.k}, "
        f"max_new_tokens={args.max_new_tokens}, batch 1, {args.per_group} prompts per task group. "
        f"ngram_lm (order {args.order}, Kneser-Ney) and retrieval (suffix array, combined with the context) were "
        f"built from {corpus_docs} documents / {corpus_tokens} tokens disjoint from the evaluation prompts, "
        f"min_confidence={args.min_confidence}. "
        f"Command: `python benchmarks/bench_ngram.py --per-group {args.per_group} --max-new-tokens "
        f"{args.max_new_tokens} --k {args.k} --min-confidence {args.min_confidence}`.",
        "",
        "Speedup = tokens/s over our AR baseline on the same prompts (total tokens / total seconds). "
        "prompt_lookup is `draft=prompt_lookup` as configured (earliest match; at most 1 / 2 tokens after a "
        "1- / 2-token match, K after a 3-token match); prompt_lookup_uncapped makes HF's proposals token for token "
        "(K after any match). PL/HF = tokens/s of our prompt_lookup over HF's (total tokens / total seconds of "
        "the group; median per-prompt ratio in brackets); uncapped/HF likewise, which isolates the engine.",
        "",
        "Cost of one target pass over T new tokens (the verify cost of T-1 draft tokens) relative to T = 1, "
        "median of 15 interleaved repeats after a prompt of the middle evaluation prompt: "
        + ", ".join(f"T={T}: {costs[T] / costs[1]:.2f}" for T in sorted(costs))
        + f" (T=1: {costs[1] * 1000:.1f} ms).",
        "",
        "| group | AR tok/s | " + " | ".join(f"{m} alpha / tau / speedup" for m in OURS)
        + " | HF PL speedup | PL/HF | uncapped/HF | identical |",
        "|---|---|" + "---|" * len(OURS) + "---|---|---|---|",
    ]
    for group in [*groups, "all"]:
        ar = tps(by[(group, "ar")])
        cells = []
        for m in OURS:
            rs = by[(group, m)]
            proposed = np.concatenate([r["proposed"] for r in rs])
            accepted = np.concatenate([r["accepted"] for r in rs])
            emitted = np.concatenate([r["emitted"] for r in rs])
            a = metrics.alpha(proposed, accepted)
            cells.append(f"{a if a is not None else float('nan'):.2f} / {metrics.tau(emitted):.2f} / "
                         f"{tps(rs) / ar:.3f}")
        hf = tps(by[(group, "hf_prompt_lookup")])
        pl_hf, uncapped_hf = (f"{tps(by[(group, m)]) / hf:.3f} ({per_prompt_ratio(m, 'hf_prompt_lookup', group):.3f})"
                              for m in ("prompt_lookup", "prompt_lookup_uncapped"))
        same = sum(r["identical"] for r in rows if (group == "all" or r["group"] == group))
        total = sum(1 for r in rows if group == "all" or r["group"] == group)
        lines.append(f"| {group} | {ar:.1f} | " + " | ".join(cells)
                     + f" | {hf / ar:.3f} | {pl_hf} | {uncapped_hf} | {same}/{total} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
