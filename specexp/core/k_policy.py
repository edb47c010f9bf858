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

from specexp.core.interface import Context, Proposal, RoundSeen
from specexp.core.metrics import position_counts


class KPolicy(Protocol):
    """Works on the host: it reads ``ctx.on_host()`` and what the engine read back of each round, never the device."""

    def begin(self, batch_size: int, k_max: int, max_new_tokens: int) -> None:
        """A new batch of prompts: per-row state starts over; what was learnt across prompts stays."""

    def choose(self, ctx: Context) -> int:
        """K for this round, 0..k_max (0: no draft)."""

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        """The part of the proposal worth verifying."""

    def observe(self, seen: RoundSeen) -> None:
        """What the round's rule accepted of what was proposed, for the rows that were active."""


def truncate(proposal: Proposal, k: int) -> Proposal:
    """The proposal's first k tokens of every row (of a tree: its first k nodes, still a tree)."""
    host = proposal.n_proposed_host
    return Proposal(tokens=proposal.tokens[:, :k], probs=proposal.probs[:, :k],
                    n_proposed=proposal.n_proposed.clamp(max=k), group=proposal.group,
                    parents=None if proposal.parents is None else proposal.parents[:, :k], reencode_s=proposal.reencode_s,
                    n_proposed_host=None if host is None else np.minimum(host, k), group_host=proposal.group_host)


def on_host(host: np.ndarray | None, device: torch.Tensor) -> np.ndarray:
    """A proposal's count as the draft built it on the host, else read back from the device."""
    return host if host is not None else device.cpu().numpy()


def expected_tokens(run_probability: np.ndarray, limits: np.ndarray, k_max: int) -> np.ndarray:
    """Expected tokens committed per round summed over rows, for K = 0..k_max [k_max+1].

    run_probability [B, k_max]: per row, P(its first i draft tokens are accepted), i = 1..k_max;
    limits [B]: most tokens a row can propose (a free draft's found continuation, else k_max).
    """
    positions = np.arange(1, k_max + 1)  # [k_max]
    kept = np.minimum(limits[:, None], np.arange(k_max + 1)[None, :])  # [B, K+1]: tokens row b keeps at K
    counted = positions[None, None, :] <= kept[:, :, None]  # [B, K+1, k_max]
    return len(limits) + (run_probability[:, None, :] * counted).sum(axis=(0, 2))


def odds(p: np.ndarray) -> np.ndarray:
    return p / (1 - p)


def prior_curve(k_max: int, counts: tuple[np.ndarray, np.ndarray] | None, prior: float, weight: float,
                cap: float) -> tuple[np.ndarray, np.ndarray]:
    """Per position, the acceptance a run starts from and how many observations it is worth [k_max]
    each: ``prior`` worth ``weight`` without counts; with the draft's (accepted, reached) counts
    from the hardware profile (its own short decodes), their rate worth at most ``cap``
    observations (a profile saw one prompt: the run's own rounds soon outweigh it)."""
    if counts is None:
        return np.full(k_max, prior), np.full(k_max, weight)
    accepted, reached = (np.pad(np.asarray(c, dtype=float)[:k_max], (0, max(k_max - len(c), 0))) for c in counts)
    return (accepted + weight * prior) / (reached + weight), np.clip(reached, weight, cap)


class ModelK:
    """`draft.k=auto`: each round's K maximises expected tokens per second under the cost model.

    Acceptance is estimated online per draft position (and, for a free draft, per the group its
    proposal names: prompt lookup's n-gram match length). Counts over the whole run so far,
    started from the draft's acceptance in the hardware profile (``prior_counts``; else a weak
    flat ``prior``), give the curve; each prompt's own acceptance so far scales it.
    Seconds come from the hardware profile:
    ``pass_seconds(context)`` [k_max+1] is a round's target pass and bookkeeping with K = 0..k_max
    draft tokens, ``draft_seconds`` [k_max+1] the draft's cost of proposing K (0 at K = 0), and
    ``fill_seconds`` what a batch pays once when the draft first proposes (a model draft's prompt
    pass), spread over the tokens the batch has left to generate.
    Every ``probe_every``-th round proposes one token more than chosen while that could plausibly
    pay (acceptance two standard errors above the estimates): a position reached only on easy
    prompts would otherwise look better than it is, and a draft that plainly loses is left alone
    (a free draft is then not even asked: its lookup costs time too).
    A row's own estimates move K away from the run's best only for a ``margin`` of predicted gain.
    """

    def __init__(self, pass_seconds: Callable[[int], np.ndarray], draft_seconds: np.ndarray, free_groups: int = 0,
                 prior: float = 0.3, prior_weight: float = 2.0, prior_counts: tuple[np.ndarray, np.ndarray] | None = None,
                 prior_cap: float = 16.0, fill_seconds: float = 0.0, prompt_weight: float = 8.0, probe_every: int = 8,
                 margin: float = 0.05):
        self.pass_seconds, self.draft_seconds, self.margin = pass_seconds, np.asarray(draft_seconds), margin
        self.free = free_groups > 0  # a free draft's tokens cost the same however many are kept: it proposes k_max
        self.groups = max(free_groups, 1)
        self.k_max = len(self.draft_seconds) - 1
        self.prior, self.prior_n = prior_curve(self.k_max, prior_counts, prior, prior_weight, prior_cap)  # [k_max] each
        self.prior_weight, self.prompt_weight, self.fill_seconds = prior_weight, prompt_weight, fill_seconds
        self.probe_every = probe_every
        self.accepted = np.zeros((self.groups, self.k_max))  # over the run: position i accepted
        self.reached = np.zeros((self.groups, self.k_max))  # over the run: position i looked at by the rule
        self.rounds = 0

    def begin(self, batch_size: int, k_max: int, max_new_tokens: int) -> None:
        if k_max != self.k_max:
            raise ValueError(f"the policy was built for k_max={self.k_max}, the draft proposes up to {k_max}")
        self.row_accepted = np.zeros((batch_size, self.groups, self.k_max))
        self.row_reached = np.zeros((batch_size, self.groups, self.k_max))
        self.estimates = None
        self.memo, self.memo_round = {}, self.rounds  # decisions by their inputs, made since memo_round
        self.max_new_tokens, self.first_lengths = max_new_tokens, None
        self.drafted = False  # the draft proposed in this batch (its fill is paid)
        self.pays_until = 0  # a free draft is asked without checking until this round
        # a model draft that declined is not asked again before the next probe round: declining, it learns
        # nothing new, and pricing its rounds anew cost ~1% of each (0.3 ms of numpy on an evicted cache)
        self.declining = False

    def acceptance(self) -> np.ndarray:
        """Per row, group and position: P(accepted | earlier ones accepted) [B, G, k_max].

        The run's estimate per position over all groups (leaning on the prior where seen little),
        per group and position (leaning on the group's own rate over its positions), its odds
        scaled per prompt by how the odds of the prompt's own acceptance so far compare with the
        run's: prompts differ in how easy they are more than in the shape of their curve, one
        number per prompt is learnt in a few rounds, and on odds an easy prompt cannot push a
        position past certainty (scaling the probability itself made every later position look
        sure on easy prompts: K too long).
        """
        if self.estimates is None:  # once per round: observe() invalidates
            prior_accepted = self.prior_n * self.prior  # [k_max]
            pooled = (self.accepted.sum(0) + prior_accepted) / (self.reached.sum(0) + self.prior_n)  # [k_max]
            overall = (self.accepted.sum() + prior_accepted.sum()) / (self.reached.sum() + self.prior_n.sum())
            # A cell seen little leans on its group over all positions where there are groups (prompt
            # lookup's match lengths differ more than its positions: pooling over groups made a rare
            # long match look like the common 1-token one), else on the run's curve.
            if self.groups > 1:
                within = (self.accepted.sum(1) + self.prompt_weight * overall) / (self.reached.sum(1) + self.prompt_weight)
                toward = within[:, None]  # [G, 1]
            else:
                toward = pooled[None]  # [1, k_max]
            run = (self.accepted + self.prior_weight * toward) / (self.reached + self.prior_weight)  # [G, k_max]
            prompt = (self.row_accepted.sum((1, 2)) + self.prompt_weight * overall) / \
                (self.row_reached.sum((1, 2)) + self.prompt_weight)  # [B]
            if self.free:  # its groups already tell an easy context from a hard one
                prompt = np.full_like(prompt, overall)
            scaled = odds(np.clip(run, 1e-6, 0.99))[None] * (odds(prompt) / odds(overall))[:, None, None]  # [B, G, k_max]
            self.estimates = np.minimum(scaled / (1 + scaled), 0.99), pooled
        return self.estimates[0]

    def optimistic(self, estimated: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Acceptance two standard errors above the estimates [B', k_max] (the run's counts behind
        each row's group, the prior's worth included)."""
        n = self.reached[group] + self.prior_n  # [B', k_max]
        return np.minimum(estimated + 2 * np.sqrt(estimated * (1 - estimated) / (n + 1)), 0.99)

    def _rate(self, run_probability: np.ndarray, limits: np.ndarray, seconds: np.ndarray, remaining: float) -> np.ndarray:
        """Tokens per second at K = 0..k_max [k_max+1]; before the draft's first proposal of the batch
        a K > 0 also pays its fill, per token the batch has left (``remaining``)."""
        tokens = expected_tokens(run_probability, limits, self.k_max)  # [k_max+1]
        if not self.drafted and self.fill_seconds:
            seconds = seconds + np.r_[0.0, np.full(self.k_max, self.fill_seconds / max(remaining, 1.0))] * tokens
        return tokens / seconds

    def _memo(self, key: tuple, decide: Callable[[], object]) -> object:
        """A decision made for the same rows, groups, limits and prices within the last
        ``probe_every`` rounds, else made now: estimates move little in a few rounds, and pricing
        every K each round cost ~0.4 ms of a 21 ms round with the model's forward evicting it."""
        if self.rounds - self.memo_round >= self.probe_every:
            self.memo.clear()
            self.memo_round = self.rounds
        if key not in self.memo:
            self.memo[key] = decide()
        return self.memo[key]

    def fill_key(self, remaining: float) -> int:
        """What of the fill's price a decision depends on: nothing once the draft proposed in the
        batch, before that its share of each token left, in steps of ~9%. (Keyed by the tokens left
        themselves, a draft that kept declining missed the memo every round.)"""
        return -1 if self.drafted else round(8 * np.log2(max(remaining, 1.0)))

    def _best(self, active: np.ndarray, group: np.ndarray, limits: np.ndarray, seconds: np.ndarray,
              remaining: float) -> int:
        """The K with the most tokens per second for these rows (memoised), on every
        ``probe_every``-th round one more where that could plausibly pay (a close call keeps being
        measured)."""
        self.rounds += 1
        key = (active.tobytes(), group.tobytes(), limits.tobytes(), seconds.tobytes(), self.fill_key(remaining))
        k = self._memo(key, lambda: self._best_k(active, group, limits, seconds, remaining))
        if k < int(limits.max(initial=0)) and self.rounds % self.probe_every == 0:
            estimated = self.acceptance()[np.nonzero(active)[0], group]  # [B', k_max]
            rate = self._rate(np.cumprod(estimated, axis=-1), limits, seconds, remaining)
            optimistic = self._rate(np.cumprod(self.optimistic(estimated, group), axis=-1), limits, seconds, remaining)
            k += int(optimistic[k + 1] > rate[k])
        return k

    def _best_k(self, active: np.ndarray, group: np.ndarray, limits: np.ndarray, seconds: np.ndarray,
                remaining: float) -> int:
        """The K with the most tokens per second for these rows; a K other than the run's own best
        (pooled over prompts and groups) only when it promises ``margin`` more: estimates this
        close are within their noise, and each switch to a longer pass is paid for surely."""
        estimated = self.acceptance()[np.nonzero(active)[0], group]  # [B', k_max]
        rate = self._rate(np.cumprod(estimated, axis=-1), limits, seconds, remaining)
        pooled = np.broadcast_to(self.pooled(), estimated.shape)
        run_k = int(np.argmax(self._rate(np.cumprod(pooled, axis=-1), limits, seconds, remaining)))
        k = int(np.argmax(rate))
        return k if rate[k] >= (1 + self.margin) * rate[run_k] else run_k

    def _remaining(self, ctx: Context, active: np.ndarray) -> float:
        """Tokens the batch's active rows have left to generate (EOS aside)."""
        lengths = ctx.on_host().lengths
        if self.first_lengths is None:
            self.first_lengths = lengths - 1  # the prompt pass gave each row its first token
        return float((self.max_new_tokens - (lengths - self.first_lengths))[active].sum())

    def _could_pay(self, active: np.ndarray, seconds: np.ndarray, remaining: float) -> bool:
        """Whether a free draft's proposal could plausibly pay this round: its most hopeful group's
        acceptance two standard errors up, every row finding k_max tokens, against a round that
        does not look them up at all."""
        rows = np.nonzero(active)[0]
        estimated = self.acceptance()[rows]  # [B', G, k_max]
        hopeful = np.stack([self.optimistic(estimated[:, g], np.full(len(rows), g)) for g in range(self.groups)], 1)
        run_probability = np.cumprod(hopeful, axis=-1).max(1)  # [B', k_max]
        rate = self._rate(run_probability, np.full(len(rows), self.k_max), seconds, remaining)
        return bool(rate[1:].max() > (len(rows) / (seconds[0] - self.draft_seconds[-1])))

    def pooled(self) -> np.ndarray:
        """The run's acceptance per position over every group and prompt [k_max]."""
        self.acceptance()
        return self.estimates[1]

    def choose(self, ctx: Context) -> int:
        if self.free and self.rounds < self.pays_until:  # decided within the last probe_every rounds
            return self.k_max
        if self.declining and (self.rounds + 1) % self.probe_every:  # no new evidence until the next probe round
            self.rounds += 1
            return 0
        host = ctx.on_host()
        active = ~host.done
        seconds = self.pass_seconds(int(host.lengths.max()))
        remaining = self._remaining(ctx, active)
        if self.free:  # it proposes all it finds (shorten keeps what pays), or is not asked
            pays = self._memo(("free", active.tobytes(), seconds.tobytes(), self.fill_key(remaining)),
                              lambda: self._could_pay(active, seconds + self.draft_seconds[-1], remaining))
            self.rounds += not pays  # a round it sat out counts towards the next refresh
            if pays and self.drafted:
                self.pays_until = self.rounds + self.probe_every
            return self.k_max if pays else 0
        limits = np.full(int(active.sum()), self.k_max)
        k = self._best(active, np.zeros(len(limits), dtype=int), limits, seconds + self.draft_seconds, remaining)
        self.declining = k == 0
        return k

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        if not self.free:
            return proposal
        host = ctx.on_host()
        active = ~host.done
        seconds = self.pass_seconds(int(host.lengths.max())) + self.draft_seconds[-1]  # the draft's cost is spent
        remaining = 0.0 if self.drafted else self._remaining(ctx, active)  # only the fill's share needs it
        group, proposed = on_host(proposal.group_host, proposal.group), on_host(proposal.n_proposed_host,
                                                                                proposal.n_proposed)
        k = self._best(active, group[active], proposed[active], seconds, remaining)
        return truncate(proposal, k)

    def observe(self, seen: RoundSeen) -> None:
        if seen.n_nodes == 0:
            return  # nothing proposed, nothing learnt
        rows, proposed, accepted = seen.active, seen.n_proposed, seen.n_accepted
        group = seen.group if self.free else np.zeros_like(proposed)
        reached, took = position_counts(proposed, accepted, rows, self.k_max)  # [B, k_max] each
        batch = np.arange(len(rows))
        self.row_reached[batch, group] += reached  # one group per row: the pairs are distinct
        self.row_accepted[batch, group] += took
        if self.groups == 1:
            self.reached[0] += reached.sum(0)
            self.accepted[0] += took.sum(0)
        else:  # rows may share a group
            np.add.at(self.reached, group, reached)
            np.add.at(self.accepted, group, took)
        self.estimates = None
        self.drafted = True


class HeuristicK:
    """HF's ``num_assistant_tokens_schedule="heuristic"``: K grows by 2 after a round whose every
    active row accepted all it proposed, else shrinks by 1 (never below 1); carried across batches."""

    def __init__(self, start: int | None = None):
        self.start, self.k = start, None

    def begin(self, batch_size: int, k_max: int, max_new_tokens: int) -> None:
        self.k_max = k_max
        if self.k is None:
            self.k = min(self.start or k_max, k_max)

    def choose(self, ctx: Context) -> int:
        return self.k

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        return proposal

    def observe(self, seen: RoundSeen) -> None:
        all_taken = bool(((seen.n_accepted == seen.n_proposed) | ~seen.active).all()) and seen.n_nodes > 0
        self.k = min(self.k + 2, self.k_max) if all_taken else max(self.k - 1, 1)
