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

from specexp.core.interface import Context, Drafter
from specexp.core.kv import hidden_features
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.drafts.base import common_prefix
from specexp.errors import UserInputError


@dataclass
class ReplayedRounds:
    """Per round of a replay: the conditional acceptance estimated at each proposed depth."""

    conditional: list[np.ndarray] = field(default_factory=list)  # [R] of [n_r]: P(depth i | depths < i accepted)
    draft_s: list[float] = field(default_factory=list)  # [R] seconds proposing

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
def replay(drafter: Drafter, prompt: list[int], reference: list[int], probs: torch.Tensor | None,
           features: torch.Tensor | None, k: int, sampling: SamplingConfig, generator: torch.Generator | None,
           device: torch.device, new_tokens: int | None = None) -> ReplayedRounds:
    """Rounds of ``drafter`` at K = k along the target's continuation ``reference`` of ``prompt`` (whose
    first token the prompt pass yields) until ``new_tokens`` of it are committed (None: all of it);
    ``probs`` [A, V]: p at each of its positions (sampling). A reference k tokens longer than
    new_tokens judges the last rounds' proposals in full, as the study's target does."""
    if drafter.traits.branches > 1 or drafter.traits.shares_target_pass:
        raise UserInputError("the acceptance replay takes chain drafts with their own passes; use a chain "
                             "(draft.branches=1) and, for early exit, draft.mode=naive (the same drafts)")
    P, A = len(prompt), len(reference)
    tokens = torch.zeros(1, P + A + k + 2, dtype=torch.long, device=device)
    tokens[0, : P + A] = torch.tensor(prompt + reference)
    buffer = None
    if features is not None:  # the committed slots' target features, as the engine keeps them
        buffer = torch.zeros(1, tokens.shape[1], features.shape[-1], dtype=features.dtype, device=features.device)
        buffer[:, : P + A] = features
    ctx = Context(tokens=tokens, start=torch.zeros(1, dtype=torch.long, device=device),
                  lengths=torch.tensor([P + 1], device=device), done=torch.zeros(1, dtype=torch.bool, device=device),
                  features=buffer)
    drafter.reset(ctx)
    rounds, t = ReplayedRounds(), 1  # t: tokens of R committed
    stop = A if new_tokens is None else min(new_tokens, A)
    while t < stop:
        started = time.perf_counter()
        proposal = drafter.propose(ctx, k, sampling, generator)
        rounds.draft_s.append(time.perf_counter() - started)
        n = int(proposal.n_proposed[0])
        drafted = proposal.tokens[0, :n].tolist()
        match = common_prefix(drafted, reference[t : t + n])
        if probs is None:  # greedy: R's argmax continues the first `match` tokens, then rejects (where R goes on)
            conditional = np.array([1.0] * match + [0.0] * (n > match and t + match < A))
        else:
            depth = min(n, A - t)
            p, q = probs[t : t + depth], proposal.probs[0, :depth].to(probs)
            conditional = torch.minimum(p, q).sum(-1).clamp(0, 1).cpu().numpy()
        rounds.conditional.append(conditional)
        kept = min(match, A - 1 - t)  # R's next token follows the kept ones
        order = torch.arange(proposal.tokens.shape[1], device=device)[None]  # a chain's accepted path, as the engine fills it
        proposal.accepted_path = torch.where(order < kept, order, -1)
        ctx.lengths += kept + 1
        drafter.update(ctx, proposal, torch.tensor([kept], device=device))
        t += kept + 1
    return rounds
