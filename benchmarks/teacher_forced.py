"""How well draft exports predict the default target on MT-bench, without timing anything.

  python benchmarks/teacher_forced.py FOLDER [FOLDER ...] [--prompts 16] [--max-new-tokens 64] [--prompt-set self]
      [--quantize int8] [--out FILE]

The target first writes its greedy answers to the first MT-bench turns (or, with --prompt-set self,
to user turns it writes itself like the distillation corpus's, from generator seeds the corpus
never used: the in-domain figure); then each draft reads prompt + answer in one forward pass
(teacher forcing), and at every answer position we compare its next-token distribution with the
target's:
- greedy_match: the two argmaxes agree. Along the target's own greedy trajectory this is what K = 1
  greedy verification accepts (the engine's alpha counts only the positions where a round starts).
- alpha@0.7: E[sum min(p, q)] = 1 - TVD at temperature 0.7, the expected acceptance of one drafted
  token when both sample at T = 0.7.
- coverage: answer tokens inside the draft's vocabulary (a reduced-vocabulary draft can never
  propose the others).
With --quantize each draft is also scored with int8 weights (draft.quantize).
A cheap proxy (a minute per draft on 2 CPU cores) to rank candidates before bench_distilled.py times them.
"""

import argparse
import dataclasses
import datetime

import pandas as pd
import torch
from common import decode_ours, machine

from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.data import encode_prompts, mt_bench
from specexp.drafts.quantize import quantize_linears
from specexp.models import LoadedModel, load_embedded_target, load_model
from specexp.ngram.corpus import self_written_prompts
from specexp.report import markdown_table

T07 = SamplingConfig(temperature=0.7)
SELF_SEED = 1_000_000


def target_answers(target: LoadedModel, encoded: list[list[int]], max_new: int) -> list[list[int]]:
    return [decode_ours(target, ids, None, max_new).tokens[0] for ids in encoded]


def answer_logits(model: LoadedModel, ids: list[int], answer: list[int]) -> torch.Tensor:
    """Next-token logits [A, V_target] at the positions that predict the answer's A tokens."""
    x = torch.tensor([ids + answer])  # [1, P + A]
    if model.draft_vocab is not None:
        x = model.draft_vocab.to_draft(x)
    logits = model.model(input_ids=x).logits[0, len(ids) - 1 : -1].float()  # [A, V or N+1]
    return logits if model.draft_vocab is None else model.draft_vocab.to_target_logits(logits)


def agreement(target: LoadedModel, draft: LoadedModel, encoded: list[list[int]], answers: list[list[int]]) -> dict:
    matches, overlap, covered, positions = 0, 0.0, 0, 0
    for ids, answer in zip(encoded, answers, strict=True):
        p, q = answer_logits(target, ids, answer), answer_logits(draft, ids, answer)  # [A, V]
        matches += int((p.argmax(-1) == q.argmax(-1)).sum())
        overlap += float(torch.minimum(logits_to_probs(p, T07), logits_to_probs(q, T07)).sum())
        vocab = draft.draft_vocab
        covered += len(answer) if vocab is None else int(torch.isin(torch.tensor(answer), vocab.target_ids).sum())
        positions += len(answer)
    return {"greedy_match": matches / positions, "alpha@0.7": overlap / positions, "coverage": covered / positions,
            "positions": positions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafts", nargs="+", help="draft folders (HF exports of python -m specexp.distill)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-set", choices=["mt_bench", "self"], default="mt_bench")
    parser.add_argument("--quantize", choices=["int8"], help="also score each draft with int8 weights")
    parser.add_argument("--out", help="also write the table as markdown here")
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    if args.prompt_set == "self":  # the corpus's generators are seeded 0, 64, ..., far below this
        prompts = self_written_prompts(target, args.prompts, max_tokens=48, seed=SELF_SEED + args.seed)
    else:
        prompts = mt_bench(limit=args.prompts, seed=args.seed)
    encoded = encode_prompts(target.tokenizer, prompts)
    answers = target_answers(target, encoded, args.max_new_tokens)
    rows = []
    for folder in args.drafts:
        draft = load_model(folder, dtype="float32", device="cpu")
        rows.append({"draft": folder, "weights": "fp32"} | agreement(target, draft, encoded, answers))
        if args.quantize:
            draft = dataclasses.replace(draft, model=quantize_linears(draft.model, args.quantize))
            rows.append({"draft": folder, "weights": args.quantize} | agreement(target, draft, encoded, answers))
    table = markdown_table(pd.DataFrame(rows), digits=3)
    print(table)
    if args.out:
        header = (f"Teacher-forced agreement with the default target ({datetime.date.today()}; {machine()}):\n"
                  f"`python benchmarks/teacher_forced.py {' '.join(args.drafts)} --prompts {args.prompts} "
                  f"--max-new-tokens {args.max_new_tokens} --prompt-set {args.prompt_set}"
                  + (f" --quantize {args.quantize}" if args.quantize else "") + "`\n\n")
        with open(args.out, "w") as f:
            f.write(header + table)


if __name__ == "__main__":
    main()
