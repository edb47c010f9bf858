"""Where the distilled draft's cost c goes: one draft step in the engine vs the forward vs its weights.

  python benchmarks/draft_step_split.py [--draft FOLDER] [--repeats 300] [--out FILE]

Medians of `--repeats` timings, each side measured back to back in this one process on the
default target (fp32, batch 1, a 64-token cached context, one new token per step):
- the target's forward for one new token (the AR step c is measured against);
- the draft's propose + update for K = 1 right after a target forward, as in the engine's rounds
  (what the study's c counts: the target's 540 MB pass has evicted the draft's weights from the
  CPU caches), and the same in a tight loop of draft rounds (weights cache-warm);
- the draft's forward alone for one new token through its ragged KV cache;
- the draft's weight matmuls alone (every 2-D weight but the input embedding, one token):
  the part of a step that streams the 11.8M parameters; the rest is per-call overhead.
"""

import argparse
import datetime
import time

import torch
from common import machine

from specexp.core.kv import RaggedKV
from specexp.core.sampling import SamplingConfig
from specexp.drafts.base import Context
from specexp.drafts.small_lm import DISTILLED_DRAFT, SmallLMDrafter
from specexp.models import load_embedded_target

CONTEXT = 64


def median_ms(fn, repeats: int, before=None) -> float:
    """Median milliseconds of fn(); ``before`` runs untimed ahead of each call."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def one_token_forward(model: torch.nn.Module, draft_ids=lambda x: x):
    """A closure: append one token to a CONTEXT-token cache, then drop it again."""
    kv = RaggedKV.empty(model, 1, torch.device("cpu"))
    kv.forward(model, draft_ids(torch.ones(1, CONTEXT, dtype=torch.long)), torch.ones(1, CONTEXT, dtype=torch.long))
    x, one = draft_ids(torch.ones(1, 1, dtype=torch.long)), torch.ones(1, dtype=torch.long)

    def step():
        kv.forward(model, x, logits_to_keep=1)
        kv.drop_last(one)
    return step


def weight_matmuls(model: torch.nn.Module):
    weights = [w for name, w in model.named_parameters() if w.dim() == 2 and "embed_tokens" not in name]
    if model.config.tie_word_embeddings:  # the head is the embedding matrix
        weights.append(model.get_input_embeddings().weight)
    inputs = [torch.randn(1, w.shape[1]) for w in weights]
    return lambda: [torch.nn.functional.linear(x, w) for x, w in zip(inputs, weights, strict=True)]


def engine_round(drafter: SmallLMDrafter):
    """propose + update for one round that accepts nothing, on a fixed committed context."""
    tokens = torch.ones(1, CONTEXT + 8, dtype=torch.long)
    ctx = Context(tokens=tokens, start=torch.zeros(1, dtype=torch.long), lengths=torch.full((1,), CONTEXT),
                  done=torch.zeros(1, dtype=torch.bool))
    drafter.reset(ctx)
    greedy, none = SamplingConfig(), torch.zeros(1, dtype=torch.long)

    def round_():
        proposal = drafter.propose(ctx, greedy, None)
        drafter.update(ctx, proposal, none)
        drafter.kv.drop_last(torch.ones(1, dtype=torch.long))  # back to the same cached prefix
    return round_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", default=str(DISTILLED_DRAFT))
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", help="also write the table as markdown here")
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    drafter = SmallLMDrafter(target, args.draft, k=1, dtype="float32", device="cpu")
    draft = drafter.draft
    to_draft = (lambda x: x) if draft.draft_vocab is None else draft.draft_vocab.to_draft
    target_step, draft_round = one_token_forward(target.model), engine_round(drafter)
    rows = {  # name -> (timed, run untimed before each call)
        "target forward, 1 token (the AR step)": (target_step, None),
        "draft propose + update, K = 1, after a target forward (the engine's draft step)": (draft_round, target_step),
        "draft propose + update, K = 1, in a loop (weights cache-warm)": (draft_round, None),
        "draft forward, 1 token, in a loop": (one_token_forward(draft.model, to_draft), None),
        "draft weight matmuls alone, in a loop": (weight_matmuls(draft.model), None),
    }
    for fn, before in rows.values():  # warm-up
        median_ms(fn, 10, before)
    ms = {name: median_ms(fn, args.repeats, before) for name, (fn, before) in rows.items()}
    ar = next(iter(ms.values()))
    lines = ["| what | ms (median) | / AR step |", "|---|---|---|"]
    lines += [f"| {name} | {t:.2f} | {t / ar:.3f} |" for name, t in ms.items()]
    table = "\n".join(lines)
    print(table)
    if args.out:
        shipped = args.draft == str(DISTILLED_DRAFT)
        draft_name = "draft=distilled" if shipped else args.draft
        command = f"python benchmarks/draft_step_split.py --repeats {args.repeats}"
        command += "" if shipped else f" --draft {args.draft}"
        header = f"Where the draft's c goes ({datetime.date.today()}; {machine()}; {draft_name}):\n`{command}`\n\n"
        with open(args.out, "w") as f:
            f.write(header + table + "\n")


if __name__ == "__main__":
    main()
