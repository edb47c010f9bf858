"""How well draft exports predict the default target on MT-bench, without timing anything.

  python benchmarks/teacher_forced.py FOLDER [FOLDER ...] [--prompts 16] [--max-new-tokens 64] [--prompt-set self]
      [--quantize int8] [--eagle-window 64 128] [--out FILE]

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
A FOLDER may also be a feature head (`student=eagle|eagle3|medusa`): it reads the target's hidden
states from the same pass (Medusa: its first head). With --eagle-window an EAGLE head is also scored
seeing only the last W entries of its own context at each position (its training blocks are 128
tokens: is a longer context outside what it learned?).
A cheap proxy (a minute per draft on 2 CPU cores) to rank candidates before bench_distilled.py times them.
"""

import argparse
import dataclasses
import datetime
from pathlib import Path

import pandas as pd
import torch
from common import decode_ours, machine

from specexp.core.kv import hidden_features
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.data import encode_prompts, mt_bench
from specexp.drafts.parts.eagle_head import EagleHead
from specexp.drafts.parts.feature_head import FeatureHead
from specexp.drafts.parts.medusa_heads import MedusaHeads
from specexp.drafts.parts.quantize import quantize_linears
from specexp.models import LoadedModel, load_model
from specexp.models.embedded import load_embedded_target
from specexp.ngram.corpus import self_written_prompts
from specexp.output import markdown_table

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


def head_answer_logits(target: LoadedModel, head: FeatureHead, ids: list[int], answer: list[int],
                       window: int | None = None) -> torch.Tensor:
    """A feature head's next-token logits [A, V_target] at the answer's positions, reading the
    target's features of prompt + answer (entry t: features t and token t+1, predicting t+2)."""
    x = torch.tensor([ids + answer])  # [1, P + A]
    out = target.model(input_ids=x, output_hidden_states=True)
    features = hidden_features(out, head.hidden_layers)  # [1, P + A, F]
    first = len(ids) - 2  # the entry whose prediction is the answer's first token
    if isinstance(head, MedusaHeads):  # head 1 reads the features at t and predicts t + 2
        return head.target_logits(head(features[0, first : first + len(answer)], 1)[:, 0]).float()
    if window is None:
        logits = head.unrolled(x, features)[0][0][0, first : first + len(answer)]  # [A, C]
    else:  # entry t sees entries t-W+1..t only (the head's positions restart at 0 in every window)
        logits = torch.stack([head.unrolled(x[:, max(0, t - window + 1) : t + 2],
                                            features[:, max(0, t - window + 1) : t + 2])[0][0][0, -1]
                              for t in range(first, first + len(answer))])
    return head.target_logits(logits).float()


def agreement(target: LoadedModel, draft: LoadedModel | FeatureHead, encoded: list[list[int]],
              answers: list[list[int]], window: int | None = None) -> dict:
    matches, overlap, covered, positions = 0, 0.0, 0, 0
    for ids, answer in zip(encoded, answers, strict=True):
        p = answer_logits(target, ids, answer)  # [A, V]
        q = (head_answer_logits(target, draft, ids, answer, window) if isinstance(draft, FeatureHead)
             else answer_logits(draft, ids, answer))
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
    parser.add_argument("--eagle-window", type=int, nargs="*", default=[],
                        help="also score EAGLE heads seeing only their last W entries")
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
        head = next((cls for cls in (EagleHead, MedusaHeads) if (Path(folder) / cls.files()[0]).is_file()), None)
        if head is not None:
            head = head.load(folder, target).float()
            rows.append({"draft": folder, "weights": "fp32"} | agreement(target, head, encoded, answers))
            for window in args.eagle_window if isinstance(head, EagleHead) else []:
                rows.append({"draft": f"{folder} (last {window})", "weights": "fp32"}
                            | agreement(target, head, encoded, answers, window))
            continue
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
                  + (f" --quantize {args.quantize}" if args.quantize else "")
                  + (f" --eagle-window {' '.join(map(str, args.eagle_window))}" if args.eagle_window else "") + "`\n\n")
        with open(args.out, "w") as f:
            f.write(header + table)


if __name__ == "__main__":
    main()
