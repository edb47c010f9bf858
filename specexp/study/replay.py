"""Acceptance predicted before decoding: a draft replayed along the target's own continuations.

The target writes its continuation R of each prompt once (greedy, or sampled with the study's warp)
and one teacher-forced pass gives p at every position of R. The draft then runs through its own
contract (reset, propose, update) round after round along R with no target pass: each round it
proposes from the committed prefix, the round keeps the longest prefix of the proposal that R
continues with, and R's next token is committed after it, as a rejection would commit it.
- greedy: these are the study's own rounds (the engine accepts what the target's argmax, R,
  continues), so the acceptance curve is the one the study will measure, to the token;
- sampled: round r's conditional acceptance at depth i is estimated by sum_v min(p(v), q_i(v)),
  p at R's position t + i - 1 (exact while the draft's first i - 1 tokens are R's, the usual i.i.d.
  reading otherwise), weighted by that round's chance to reach depth i (the product of its earlier
  estimates).
A chain only: the proxy of a token tree's acceptance is not built.
"""

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specexp.core.engine import left_pad
from specexp.core.interface import Context, Drafter, Proposal
from specexp.core.kv import hidden_features
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.drafts.base import common_prefix
from specexp.errors import UserInputError


@dataclass
class ReplayedRounds:
    """Per round of a replay: the conditional acceptance estimated at each proposed depth."""

    conditional: list[np.ndarray] = field(default_factory=list)  # [R] of [n_r]: P(depth i | depths < i accepted)
    draft_s: list[float] = field(default_factory=list)  # seconds of each propose call (one per round of the whole batch)

    def extend(self, other: "ReplayedRounds") -> None:
        self.conditional += other.conditional
        self.draft_s += other.draft_s


def reach_weights(conditional: np.ndarray) -> np.ndarray:
    """[n] conditional acceptances -> [n] chance the round reaches each depth (1 at depth 1)."""
    return np.concatenate([[1.0], np.cumprod(conditional)[:-1]]) if len(conditional) else conditional


def acceptance_curve(rounds: ReplayedRounds, k: int) -> list[float | None]:
    """P(depth i accepted | depths < i accepted) for i = 1..k: each round's estimate weighted by its
    chance to reach depth i (under greedy: the rounds that reached it, as metrics.acceptance_curve)."""
    took, reached = np.zeros(k), np.zeros(k)
    for c in rounds.conditional:
        n = min(len(c), k)
        w = reach_weights(c[:n])
        took[:n] += w * c[:n]
        reached[:n] += w
    return [float(took[i] / reached[i]) if reached[i] > 0 else None for i in range(k)]


def alpha(rounds: ReplayedRounds, k: int) -> float | None:
    """Expected accepted / expected looked-at draft positions (the study's alpha), at most k a round."""
    took = sum(float((reach_weights(c[:k]) * c[:k]).sum()) for c in rounds.conditional)
    looked = sum(float(reach_weights(c[:k]).sum()) for c in rounds.conditional)
    return took / looked if looked else None


@torch.inference_mode()
def teacher_forced(target_model, prompt: list[int], reference: list[int], sampling: SamplingConfig,
                   hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One target pass over prompt + R: p at R's positions [A, V] (None under greedy: R is the argmax)
    and the hidden states a feature draft reads [1, P + A, F] (None for other drafts)."""
    if sampling.greedy and not hidden_layers:
        return None, None
    ids = torch.tensor([prompt + reference], device=target_model.device)
    out = target_model(input_ids=ids, output_hidden_states=bool(hidden_layers))
    probs = None if sampling.greedy else logits_to_probs(out.logits[0, len(prompt) - 1 : -1].float(), sampling)
    return probs, (hidden_features(out, hidden_layers) if hidden_layers else None)


@torch.inference_mode()
def replay(drafter: Drafter, prompts: list[list[int]], references: list[list[int]], probs: list[torch.Tensor | None],
           features: list[torch.Tensor | None], k: int, sampling: SamplingConfig, generator: torch.Generator | None,
           device: torch.device, new_tokens: int | None = None) -> ReplayedRounds:
    """Rounds of ``drafter`` at K = k along the target's continuation of each prompt (whose first token
    the prompt pass yields), all prompts in one batch as the engine holds them (left-padded, each row at
    its own length), until ``new_tokens`` of each are committed (None: all of it). ``probs[b]`` [A_b, V]:
    p at each position of reference b (sampling; None under greedy); ``features[b]`` [1, P_b + A_b, F]:
    the target's hidden states a feature draft reads (None for others). A reference k tokens longer than
    new_tokens judges the last rounds' proposals in full, as the study's target does."""
    if drafter.traits.branches > 1 or drafter.traits.shares_target_pass:
        raise UserInputError("the acceptance replay takes chain drafts with their own passes; use a chain "
                             "(draft.branches=1) and, for early exit, draft.mode=naive (the same drafts)")
    ctx = reference_context(prompts, references, features, k, device)
    stop = torch.tensor([len(r) if new_tokens is None else min(new_tokens, len(r)) for r in references], device=device)
    committed = torch.ones(len(prompts), dtype=torch.long, device=device)  # t per row: tokens of its reference committed
    ctx.done = committed >= stop
    drafter.reset(ctx)
    rounds = ReplayedRounds()
    while not bool(ctx.done.all()):
        started = time.perf_counter()
        proposal = drafter.propose(ctx, k, sampling, generator)
        rounds.draft_s.append(time.perf_counter() - started)
        kept = torch.zeros_like(committed)
        for b in torch.nonzero(~ctx.done).flatten().tolist():
            conditional, kept[b] = judge_row(proposal, b, references[b], probs[b], int(committed[b]))
            rounds.conditional.append(conditional)
        order = torch.arange(proposal.tokens.shape[1], device=device)[None]  # a chain's accepted path, as the engine fills it
        proposal.accepted_path = torch.where(order < kept[:, None], order, -1)
        moved = torch.where(ctx.done, 0, kept + 1)  # R's next token follows the kept ones; finished rows stay
        ctx.lengths = ctx.lengths + moved
        committed = committed + moved
        ctx.done = committed >= stop
        drafter.update(ctx, proposal, kept)
    return rounds


def reference_context(prompts: list[list[int]], references: list[list[int]], features: list[torch.Tensor | None],
                      k: int, device: torch.device) -> Context:
    """The batch as the engine keeps it after the prompt pass: row b holds its left-padded prompt and,
    past its committed first token, the rest of its reference already in place (each round commits
    the reference's own tokens), with k + 2 slots of scratch."""
    prompt_ids, prompt_mask = left_pad(prompts, 0, device)  # [B, P], laid out as the engine's prompt pass
    B, P = prompt_ids.shape
    width = P + max(len(r) for r in references) + k + 2
    tokens = torch.zeros(B, width, dtype=torch.long, device=device)
    tokens[:, :P] = prompt_ids
    buffer = None
    if features[0] is not None:  # the committed slots' target features, as the engine keeps them
        buffer = torch.zeros(B, width, features[0].shape[-1], dtype=features[0].dtype, device=device)
    for b, reference in enumerate(references):
        tokens[b, P : P + len(reference)] = torch.tensor(reference)
        if buffer is not None:
            buffer[b, P - len(prompts[b]) : P + len(reference)] = features[b][0]
    return Context(tokens=tokens, start=P - prompt_mask.sum(1), lengths=torch.full((B,), P + 1, device=device),
                   done=torch.zeros(B, dtype=torch.bool, device=device), features=buffer)


def judge_row(proposal: Proposal, b: int, reference: list[int], probs: torch.Tensor | None, t: int) -> tuple[np.ndarray, int]:
    """Row b's round, t tokens of its reference committed: the conditional acceptance at each depth
    it proposed, and how many of its tokens the reference continues with (at most to its end)."""
    n = int(proposal.n_proposed[b])
    A = len(reference)
    match = common_prefix(proposal.tokens[b, :n].tolist(), reference[t : t + n])
    if probs is None:  # greedy: R's argmax continues the first `match` tokens, then rejects (where R goes on)
        conditional = np.array([1.0] * match + [0.0] * (n > match and t + match < A))
    else:
        depth = min(n, A - t)
        p, q = probs[t : t + depth], proposal.probs[b, :depth].to(probs)
        conditional = torch.minimum(p, q).sum(-1).clamp(0, 1).cpu().numpy()
    return conditional, min(match, A - 1 - t)
