"""How the prompt-lookup defaults were chosen: replay held-out greedy decodes through lookup rules.

  python benchmarks/replay_lookup.py [--per-group 10]

Greedy output does not depend on the draft, so one AR decode per prompt fixes every round a
lookup rule would make: propose from the committed tokens, accept the matching prefix, commit
it plus one. Each round is charged the measured cost of a target pass over its T tokens
(`pass_cost` of bench_ngram.py). Prompts are Spec-Bench questions that bench_ngram.py uses for
neither evaluation nor its corpus answers (with its default --per-group 12, --corpus-per-group 6).
Prints, per task group, each rule's target time relative to HF's rule (earliest match, K tokens).
"""

import argparse
from collections import defaultdict

import torch
from bench_ngram import pass_cost, split_prompts, task_group
from common import decode_ours
from tqdm import tqdm

from specexp.data import SPEC_BENCH_FILE, encode_prompts
from specexp.drafts.parts.context_index import ContextIndex
from specexp.drafts.prompt_lookup import cap_continuation
from specexp.models.embedded import load_embedded_target

RULES = {  # name -> (choice, tokens proposed after a match of 1, 2, ... tokens; longer: K)
    "HF (first, uncapped)": ("first", ()),
    "recent, uncapped": ("recent", ()),
    "frequent, uncapped": ("frequent", ()),
    "first, caps [1, 2] (default)": ("first", (1, 2)),
    "recent, caps [1, 2]": ("recent", (1, 2)),
    "first, caps [0, 2]": ("first", (0, 2)),
    "first, caps [2]": ("first", (2,)),
    "first, caps [1, 3]": ("first", (1, 3)),
}


def replay(prompt: list[int], output: list[int], k: int, choice: str, caps: tuple[int, ...],
           cost: dict[int, float]) -> float:
    """Target time (in T=1 passes) of decoding ``output`` with one lookup rule (max_n = 3)."""
    index = ContextIndex(3, 1)
    index.extend(prompt + output[:1])  # the prompt pass gave the first token
    done, time = 1, 0.0
    while done < len(output):
        n, continuation = index.lookup(k, choice)
        draft = cap_continuation(continuation, n, caps, k)
        accepted = 0
        while accepted < len(draft) and done + accepted < len(output) and draft[accepted] == output[done + accepted]:
            accepted += 1
        step = min(accepted + 1, len(output) - done)
        index.extend(output[done : done + step])
        done += step
        time += cost[len(draft) + 1]
    return time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec-bench", default=str(SPEC_BENCH_FILE),
                        help="a Spec-Bench question.jsonl (default: the copy in the package)")
    parser.add_argument("--skip", type=int, default=18, help="prompts per group used by bench_ngram.py")
    parser.add_argument("--per-group", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    # bench_ngram.py's own split, shifted past the prompts it uses: its "corpus answers" slot here.
    _, held_out, _ = split_prompts(args.spec_bench, args.skip, args.per_group, seed=0)
    encoded = encode_prompts(target.tokenizer, held_out)
    seconds = pass_cost(target, encoded[len(encoded) // 2], args.k)
    cost = {T: s / seconds[1] for T, s in seconds.items()}

    time = defaultdict(lambda: defaultdict(float))
    for prompt, ids in zip(tqdm(held_out, desc="AR decodes"), encoded, strict=True):
        output = decode_ours(target, ids, None, args.max_new_tokens).tokens[0]
        for name, (choice, caps) in RULES.items():
            time[task_group(prompt.category)][name] += replay(ids, output, args.k, choice, caps, cost)
    groups = sorted(time)
    print(f"pass cost by T: {', '.join(f'{T}: {c:.2f}' for T, c in cost.items())}; "
          f"{args.per_group} held-out prompts per group; target time relative to HF's rule")
    print("| rule | " + " | ".join(groups) + " | all |")
    print("|---|" + "---|" * (len(groups) + 1))
    hf = "HF (first, uncapped)"
    for name in RULES:
        cells = [time[g][name] / time[g][hf] for g in groups]
        total = sum(time[g][name] for g in groups) / sum(time[g][hf] for g in groups)
        print(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {total:.3f} |")


if __name__ == "__main__":
    main()
