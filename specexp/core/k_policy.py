"""How many tokens a round drafts: `draft.k=auto` (the cost model's choice) and HF's heuristic.

The engine asks a policy for each round's K before the draft proposes (0: the round runs
without the draft, a plain AR step), lets it shorten the proposal after (a draft whose tokens
cost nothing, like prompt lookup, proposes all it has and the policy keeps what pays), and
tells it what was accepted. Any K keeps the output exact: only the speed depends on it.
"""

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from specexp.core.interface import Context, Proposal


class KPolicy(Protocol):
    def begin(self, batch_size: int, k_max: int) -> None:
        """A new batch of prompts: per-row state starts over; what was learnt across prompts stays."""

    def choose(self, ctx: Context) -> int:
        """K for this round, 0..k_max (0: no draft)."""

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        """The part of the proposal worth verifying."""

    def observe(self, proposal: Proposal, n_accepted: torch.Tensor, active: torch.Tensor) -> None:
        """What the round's rule accepted ([B] long) of the proposal, for the rows that were active ([B] bool)."""


def truncate(proposal: Proposal, k: int) -> Proposal:
    """The proposal's first k tokens of every row."""
    return Proposal(tokens=proposal.tokens[:, :k], probs=proposal.probs[:, :k],
                    n_proposed=proposal.n_proposed.clamp(max=k), group=proposal.group)


def expected_tokens(run_probability: np.ndarray, limits: np.ndarray, k_max: int) -> np.ndarray:
    """Expected tokens committed per round summed over rows, for K = 0..k_max [k_max+1].

    run_probability [B, k_max]: per row, P(its first i draft tokens are accepted), i = 1..k_max;
    limits [B]: most tokens a row can propose (a free draft's found continuation, else k_max).
    """
    positions = np.arange(1, k_max + 1)  # [k_max]
    per_k = np.zeros(k_max + 1)
    for k in range(k_max + 1):
        counted = positions[None, :] <= np.minimum(limits, k)[:, None]  # [B, k_max]
        per_k[k] = len(limits) + (run_probability * counted).sum()
    return per_k


class ModelK:
    """`draft.k=auto`: each round's K maximises expected tokens per second under the cost model.

    Acceptance is estimated online per draft position (and per group of a free draft, e.g. the
    length of prompt lookup's n-gram match): counts over the whole run so far (started from a
    weak prior) shrunk toward by each prompt's own counts. Seconds come from the hardware profile:
    ``pass_seconds(context)`` [k_max+1] is a round's target pass and bookkeeping with K = 0..k_max
    draft tokens, ``draft_seconds`` [k_max+1] the draft's cost of proposing K (0 at K = 0).
    Every ``probe_every``-th round proposes one token more than chosen, so positions past the
    choice keep being measured.
    """

    def __init__(self, pass_seconds: Callable[[int], np.ndarray], draft_seconds: np.ndarray, groups: int = 1,
                 prior: float = 0.5, prior_weight: float = 2.0, prompt_weight: float = 4.0, probe_every: int = 8):
        self.pass_seconds, self.draft_seconds, self.groups = pass_seconds, np.asarray(draft_seconds), groups
        self.prior, self.prior_weight, self.prompt_weight, self.probe_every = prior, prior_weight, prompt_weight, probe_every
        self.k_max = len(self.draft_seconds) - 1
        self.accepted = np.zeros((groups, self.k_max))  # over the run: position i accepted
        self.reached = np.zeros((groups, self.k_max))  # over the run: position i looked at by the rule
        self.rounds = 0

    @property
    def free(self) -> bool:
        """A grouped draft's tokens cost the same however many are kept: it proposes k_max."""
        return self.groups > 1

    def begin(self, batch_size: int, k_max: int) -> None:
        if k_max != self.k_max:
            raise ValueError(f"the policy was built for k_max={self.k_max}, the draft proposes up to {k_max}")
        self.row_accepted = np.zeros((batch_size, self.groups, self.k_max))
        self.row_reached = np.zeros((batch_size, self.groups, self.k_max))

    def acceptance(self) -> np.ndarray:
        """Per row, group and position: P(accepted | earlier ones accepted) [B, G, k_max]."""
        run = (self.accepted + self.prior_weight * self.prior) / (self.reached + self.prior_weight)  # [G, k_max]
        return (self.row_accepted + self.prompt_weight * run) / (self.row_reached + self.prompt_weight)

    def _best(self, run_probability: np.ndarray, limits: np.ndarray, seconds: np.ndarray) -> int:
        k = int(np.argmax(expected_tokens(run_probability, limits, self.k_max) / seconds))
        self.rounds += 1
        if self.rounds % self.probe_every == 0:
            k = min(k + 1, int(limits.max(initial=0)))
        return k

    def choose(self, ctx: Context) -> int:
        if self.free:
            return self.k_max
        active = ~ctx.done.cpu().numpy()
        run_probability = np.cumprod(self.acceptance()[active, 0], axis=-1)  # [B', k_max]
        limits = np.full(int(active.sum()), self.k_max)
        return self._best(run_probability, limits, self.pass_seconds(int(ctx.lengths.max())) + self.draft_seconds)

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        if not self.free:
            return proposal
        active = ~ctx.done.cpu().numpy()
        group = proposal.group.cpu().numpy()[active]
        limits = proposal.n_proposed.cpu().numpy()[active]
        run_probability = np.cumprod(self.acceptance()[active, group], axis=-1)  # [B', k_max]
        seconds = self.pass_seconds(int(ctx.lengths.max())) + self.draft_seconds[-1]  # the draft's cost is spent
        return truncate(proposal, self._best(run_probability, limits, seconds))

    def observe(self, proposal: Proposal, n_accepted: torch.Tensor, active: torch.Tensor) -> None:
        rows = active.cpu().numpy()
        proposed, accepted = proposal.n_proposed.cpu().numpy(), n_accepted.cpu().numpy()
        group = proposal.group.cpu().numpy() if proposal.group is not None else np.zeros_like(proposed)
        position = np.arange(self.k_max)  # 0-based: position i + 1
        reached = (position < proposed[:, None]) & (position <= accepted[:, None]) & rows[:, None]  # [B, k_max]
        took = (position < accepted[:, None]) & rows[:, None]
        for b in np.nonzero(rows)[0]:
            self.row_reached[b, group[b]] += reached[b]
            self.row_accepted[b, group[b]] += took[b]
            self.reached[group[b]] += reached[b]
            self.accepted[group[b]] += took[b]


class HeuristicK:
    """HF's ``num_assistant_tokens_schedule="heuristic"``: K grows by 2 after a round whose every
    active row accepted all it proposed, else shrinks by 1 (never below 1); carried across batches."""

    def __init__(self, start: int | None = None):
        self.start, self.k = start, None

    def begin(self, batch_size: int, k_max: int) -> None:
        self.k_max = k_max
        if self.k is None:
            self.k = min(self.start or k_max, k_max)

    def choose(self, ctx: Context) -> int:
        return self.k

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        return proposal

    def observe(self, proposal: Proposal, n_accepted: torch.Tensor, active: torch.Tensor) -> None:
        all_taken = bool(((n_accepted == proposal.n_proposed) | ~active).all()) and proposal.tokens.shape[1] > 0
        self.k = min(self.k + 2, self.k_max) if all_taken else max(self.k - 1, 1)
