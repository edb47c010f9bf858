"""Where the distilled draft's cost c goes: one draft step in the engine vs the forward vs its weights.

  python benchmarks/draft_step_split.py [--draft FOLDER] [--quantize int8] [--repeats 300] [--out FILE]

Medians of `--repeats` timings per row, the rows taking turns in this one process on the
default target (fp32, batch 1, a 64-token cached context, one new token per step):
- the target's forward for one new token (the AR step c is measured against);
- the draft's propose + update for K = 1 right after a target forward, as in the engine's rounds
  (what the study's c counts: the target's 540 MB pass has evicted the draft's weights from the
  CPU caches), and the same in a tight loop of draft rounds (weights cache-warm);
- the draft's forward alone for one new token through its ragged KV cache;
- all of these for the draft run through HF's ``LlamaForCausalLM.__call__`` (how drafts ran before
  the lean forward) and through the lean forward small_lm drafts use now (`runtime/decoder.py`);
- the draft's linear layers alone (the LM head included, one token): the part of a step that
  streams the 11.8M parameters; the rest is per-call overhead.
With --quantize the draft rows are repeated for the draft with int8 weights (draft.quantize).
All rows are timed in the same turns.
"""

import argparse
import datetime
import statistics
import time

import torch
from common import machine

from specexp.core.interface import Context
from specexp.core.kv import RaggedKV
from specexp.core.sampling import SamplingConfig
from specexp.drafts.parts.quantize import Int8WeightLinear
from specexp.drafts.small_lm import DISTILLED_DRAFT, SmallLMDrafter
from specexp.models.embedded import load_embedded_target

CONTEXT = 64


def timings_s(fn, repeats: int, before=None) -> list[float]:
    """Seconds of each of `repeats` calls of fn(); ``before`` runs untimed ahead of each call."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


TURNS = 10  # rows take turns in blocks of repeats / TURNS: drift on the shared machine hits every row alike


def one_token_forward(model, draft_ids=lambda x: x):
    """A closure: append one token to a CONTEXT-token cache, then drop it again."""
    kv = RaggedKV.empty(model, 1, torch.device("cpu"))
    kv.forward(model, draft_ids(torch.ones(1, CONTEXT, dtype=torch.long)), torch.ones(1, CONTEXT, dtype=torch.long))
    x, one = draft_ids(torch.ones(1, 1, dtype=torch.long)), torch.ones(1, dtype=torch.long)

    def step():
        kv.forward(model, x, logits_to_keep=1)
        kv.drop_last(one)
    return step


def weight_matmuls(model: torch.nn.Module):
    """Every linear layer of the model (the LM head included) on one token."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear | Int8WeightLinear)]
    inputs = [torch.randn(1, m.in_features) for m in linears]
    return lambda: [m(x) for m, x in zip(linears, inputs, strict=True)]


def engine_round(drafter: SmallLMDrafter):
    """propose + update for one round that accepts nothing, on a fixed committed context."""
    tokens = torch.ones(1, CONTEXT + 8, dtype=torch.long)
    ctx = Context(tokens=tokens, start=torch.zeros(1, dtype=torch.long), lengths=torch.full((1,), CONTEXT),
                  done=torch.zeros(1, dtype=torch.bool))
    drafter.reset(ctx)
    greedy, none = SamplingConfig(), torch.zeros(1, dtype=torch.long)

    def round_():
        proposal = drafter.propose(ctx, drafter.traits.k_max, greedy, None)
        drafter.update(ctx, proposal, none)
        drafter.kv.drop_last(torch.ones(1, dtype=torch.long))  # back to the same cached prefix
    return round_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", default=str(DISTILLED_DRAFT))
    parser.add_argument("--quantize", choices=["int8"], help="also time the draft with int8 weights")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", help="also write the table as markdown here")
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    target = load_embedded_target("float32", "cpu")
    target_step = one_token_forward(target.model)
    # name -> (timed, run untimed before each call)
    rows = {"target forward, 1 token (the AR step)": (target_step, None)}
    variants = {"fp32 draft, HF forward": (None, True), "fp32 draft": (None, False)}  # name -> (quantize, HF's forward)
    variants |= {f"{args.quantize} draft": (args.quantize, False)} if args.quantize else {}
    for name, (quantize, hf_forward) in variants.items():
        drafter = SmallLMDrafter(target, args.draft, k=1, dtype="float32", device="cpu", quantize=quantize)
        if hf_forward:  # what drafts ran before the lean forward (LlamaForCausalLM.__call__)
            drafter.forward_model = drafter.draft.model
        to_draft = (lambda x: x) if drafter.draft_vocab is None else drafter.draft_vocab.to_draft
        draft_round = engine_round(drafter)  # one closure: each engine_round resets the drafter's cache
        rows |= {
            (f"{name}: propose + update, K = 1, after a target forward "
             "(the engine's draft step)"): (draft_round, target_step),
            f"{name}: propose + update, K = 1, in a loop (weights cache-warm)": (draft_round, None),
            f"{name}: forward, 1 token, in a loop": (one_token_forward(drafter.forward_model, to_draft), None),
        }
        if not hf_forward:
            rows[f"{name}: linear layers alone, in a loop"] = (weight_matmuls(drafter.draft.model), None)
    for fn, before in rows.values():  # warm-up
        timings_s(fn, 10, before)
    times = {name: [] for name in rows}
    for _ in range(TURNS):
        for name, (fn, before) in rows.items():
            times[name] += timings_s(fn, max(1, args.repeats // TURNS), before)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
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
        command += f" --quantize {args.quantize}" if args.quantize else ""
        header = f"Where the draft's c goes ({datetime.date.today()}; {machine()}; {draft_name}):\n`{command}`\n\n"
        with open(args.out, "w") as f:
            f.write(header + table + "\n")


if __name__ == "__main__":
    main()
