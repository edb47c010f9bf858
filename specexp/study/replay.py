"""Acceptance predicted before decoding: a draft replayed along the target's own continuations.

The target writes its continuation R of each prompt once (greedy, or sampled with the study's warp)
and one teacher-forced pass gives p at every position of R. The draft then runs through its own
contract (reset, propose, update) round after round along R with no target pass: each round it
proposes from the committed prefix, the round keeps the longest prefix of the proposal that R
continues with, and R's next token is committed after it, as a rejection would commit it. Each
round records, for each depth i it proposed, the chance it accepts depths 1..i (its `run`):
- greedy: 1 while R's argmax continues the proposal, then 0: the study's own rounds (the engine
  accepts what the target's argmax, R, continues), so the acceptance is the one the study will
  measure, to the token;
- sampled: the rule accepts depths 1..i with probability sum over x_1..x_i of prod_j min(p, q)(x_j),
  each factor on the prefix x_<j. As R is drawn from p, that is the expectation over R of
  prod_{j<i} min(1, q(R_j) / p(R_j)) * sum_v min(p, q)(v) at depth i, p and q both on R's prefix:
  exact in expectation at every depth, not only the first. p along R is the teacher-forced pass; q
  along R is the round's own q while the draft's tokens are R's (for a deterministic draft the
  product is 0 past its first miss, so that is all it needs), and for a draft whose chain draws
  each token from its next-token q (`DraftTraits.markov_chain`: a small LM) its one-token proposal
  at every prefix of R (`MarkovChain.q_along`, one teacher-forced pass; `draft_along` defines it
  through the draft's contract, one step per token, and tests it). A stochastic draft of neither kind (EAGLE's, Medusa's
  heads) is judged with the round's own q past a miss: exact at depth 1, the i.i.d. reading after.
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
from specexp.drafts.parts.base import common_prefix
from specexp.errors import UserInputError


@dataclass
class ReplayedRounds:
    """Per round of a replay: the chance it accepts each depth it was judged at and all before it."""

    run: list[np.ndarray] = field(default_factory=list)  # [R] of [d_r]: P(depths 1..i accepted), i = 1..d_r
    proposed: list[int] = field(default_factory=list)  # [R]: tokens the round proposed (d_r <= it: R's end cuts)
    prompt: list[int] = field(default_factory=list)  # [R]: the prompt (its index in the replay) of the round
    # seconds of each propose call (one per round of the whole batch)
    draft_s: list[float] = field(default_factory=list)

    def extend(self, other: "ReplayedRounds", first_prompt: int = 0) -> None:
        """Add ``other``'s rounds, its prompts numbered from ``first_prompt``."""
        self.run += other.run
        self.proposed += other.proposed
        self.prompt += [first_prompt + p for p in other.prompt]
        self.draft_s += other.draft_s


def position_sums(rounds: ReplayedRounds, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Expected accepted and reached counts at depths 1..k over the rounds [k] each (depth i is
    reached when 1..i-1 are accepted: run[i - 1], and always at depth 1)."""
    took, reached = np.zeros(k), np.zeros(k)
    for run in rounds.run:
        n = min(len(run), k)
        took[:n] += run[:n]
        reached[:n] += np.concatenate([[1.0], run[: n - 1]]) if n else run[:0]
    return took, reached


def acceptance_curve(rounds: ReplayedRounds, k: int) -> list[float | None]:
    """P(depth i accepted | depths < i accepted) for i = 1..k: expected accepted over expected reached
    (under greedy: the rounds that reached it, as metrics.acceptance_curve)."""
    took, reached = position_sums(rounds, k)
    return [float(took[i] / reached[i]) if reached[i] > 0 else None for i in range(k)]


def alpha(rounds: ReplayedRounds, k: int) -> float | None:
    """Expected accepted / expected looked-at draft positions (the study's alpha), at most k a round."""
    took, reached = position_sums(rounds, k)
    return float(took.sum() / reached.sum()) if reached.sum() else None


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
           device: torch.device, new_tokens: int | None = None,
           q_along: list[torch.Tensor] | None = None) -> ReplayedRounds:
    """Rounds of ``drafter`` at K = k along the target's continuation of each prompt (whose first token
    the prompt pass yields), all prompts in one batch as the engine holds them (left-padded, each row at
    its own length), until ``new_tokens`` of each are committed (None: all of it). ``probs[b]`` [A_b, V]:
    p at each position of reference b (sampling; None under greedy); ``features[b]`` [1, P_b + A_b, F]:
    the target's hidden states a feature draft reads (None for others); ``q_along[b]`` [A_b, V]: the
    draft's own q of each token of reference b on its prefix (`draft_along`; None: the rounds' q). A
    reference k tokens longer than new_tokens judges the last rounds' proposals in full, as the
    study's target does."""
    if drafter.traits.branches > 1 or drafter.traits.shares_target_pass:
        raise UserInputError("the acceptance replay takes chain drafts with their own passes; use a chain "
                             "(draft.branches=1) and, for early exit, draft.mode=naive (the same drafts)")
    stop = torch.tensor([len(r) if new_tokens is None else min(new_tokens, len(r)) for r in references], device=device)
    ctx, committed = start_along(drafter, prompts, references, features, k, stop, device)
    rounds = ReplayedRounds()
    while not bool(ctx.done.all()):
        started = time.perf_counter()
        proposal = drafter.propose(ctx, k, sampling, generator)
        rounds.draft_s.append(time.perf_counter() - started)
        kept = torch.zeros_like(committed)
        for b in torch.nonzero(~ctx.done).flatten().tolist():
            run, kept[b] = judge_row(proposal, b, references[b], probs[b], int(committed[b]),
                                     None if q_along is None else q_along[b])
            rounds.run.append(run)
            rounds.proposed.append(int(proposal.n_proposed[b]))
            rounds.prompt.append(b)
        committed = advance_along(drafter, ctx, proposal, committed, kept, stop)
    return rounds


def start_along(drafter: Drafter, prompts: list[list[int]], references: list[list[int]],
                features: list[torch.Tensor | None], k: int, stop: torch.Tensor,
                device: torch.device) -> tuple[Context, torch.Tensor]:
    """The batch after the prompt pass with the draft reset on it, and t per row (tokens of its reference
    committed: the prompt pass's one)."""
    ctx = reference_context(prompts, references, features, k, device)
    committed = torch.ones(len(prompts), dtype=torch.long, device=device)
    ctx.done = committed >= stop
    drafter.reset(ctx)
    return ctx, committed


def advance_along(drafter: Drafter, ctx: Context, proposal: Proposal, committed: torch.Tensor, kept: torch.Tensor,
                  stop: torch.Tensor) -> torch.Tensor:
    """Commit each live row's ``kept`` proposed tokens and R's next one, as the engine would, and tell the
    draft; returns the new t per row."""
    order = torch.arange(proposal.tokens.shape[1], device=committed.device)[None]  # a chain's accepted path
    proposal.accepted_path = torch.where(order < kept[:, None], order, -1)
    moved = torch.where(ctx.done, 0, kept + 1)  # R's next token follows the kept ones; finished rows stay
    ctx.lengths = ctx.lengths + moved
    committed = committed + moved
    ctx.done = committed >= stop
    drafter.update(ctx, proposal, kept)
    return committed


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


def judge_row(proposal: Proposal, b: int, reference: list[int], probs: torch.Tensor | None, t: int,
              q_along: torch.Tensor | None = None) -> tuple[np.ndarray, int]:
    """Row b's round, t tokens of its reference committed: the chance it accepts depths 1..i for each
    depth i it proposed (up to the reference's end), and how many of its tokens the reference continues
    with. ``q_along`` [A, V]: the draft's q of each reference token on the reference's prefix."""
    n = int(proposal.n_proposed[b])
    A = len(reference)
    depth = min(n, A - t)
    match = common_prefix(proposal.tokens[b, :n].tolist(), reference[t : t + n])
    if probs is None:  # greedy: R's argmax continues the first `match` tokens, then rejects
        return np.array([1.0] * match + [0.0] * (depth - match)), min(match, A - 1 - t)
    p = probs[t : t + depth]  # [d, V]: p of depth i on R's prefix
    q = (q_along[t : t + depth] if q_along is not None else proposal.probs[b, :depth]).to(p)  # [d, V]
    truth = torch.tensor(reference[t : t + depth], device=p.device)[:, None]  # [d, 1]: R's tokens
    p_r, q_r = p.gather(1, truth)[:, 0], q.gather(1, truth)[:, 0]  # [d]: p and q of R's token at each depth
    kept_r = torch.where(p_r > 0, (q_r / p_r.clamp_min(1e-30)).clamp(max=1.0), 0.0)  # min(1, q / p) at R's token
    reach = torch.cat([torch.ones(1, device=p.device, dtype=p.dtype), torch.cumprod(kept_r, 0)[:-1]])  # [d]
    run = (reach * torch.minimum(p, q).sum(-1).clamp(0, 1)).cpu().numpy()
    return run, min(match, A - 1 - t)


@torch.inference_mode()
def draft_along(drafter: Drafter, prompts: list[list[int]], references: list[list[int]],
                features: list[torch.Tensor | None], sampling: SamplingConfig, generator: torch.Generator | None,
                device: torch.device) -> list[torch.Tensor]:
    """The draft's q of every token of each reference on the reference's own prefix [A_b, V] each
    (row 0, the prompt pass's token, stays 0): one-token proposals, committing R one token a round."""
    stop = torch.tensor([len(r) for r in references], device=device)
    ctx, committed = start_along(drafter, prompts, references, features, 1, stop, device)
    along: list[torch.Tensor | None] = [None] * len(prompts)
    while not bool(ctx.done.all()):
        proposal = drafter.propose(ctx, 1, sampling, generator)
        for b in torch.nonzero(~ctx.done).flatten().tolist():
            if along[b] is None:
                along[b] = torch.zeros(len(references[b]), proposal.probs.shape[-1], device=device)
            if proposal.probs.shape[1]:
                along[b][int(committed[b])] = proposal.probs[b, 0]
        # R's next token
        committed = advance_along(drafter, ctx, proposal, committed, torch.zeros_like(committed), stop)
    return [a if a is not None else torch.zeros(len(r), 1, device=device)
            for a, r in zip(along, references, strict=True)]
