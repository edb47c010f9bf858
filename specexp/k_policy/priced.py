"""`draft.k=auto`: each round's K chosen by the cost model from this machine's hardware profile (the priced K
policy): for a chain `PricedK` here, for a dynamic tree's node budget `PricedTreeK` (k_policy/tree.py); both
read acceptance from k_policy/acceptance.py."""

import functools
from collections.abc import Callable

import numpy as np

from specexp.core.interface import Context, Proposal, RoundSeen
from specexp.core.k_policy import KPolicy, on_host, truncate
from specexp.costs.hardware_profile import Profile
from specexp.errors import UserInputError
from specexp.k_policy.acceptance import AcceptanceEstimate
from specexp.k_policy.tree import PricedTreeK

# Nearby context lengths are priced alike because T(n, L) barely moves within a block of them
# (docs/lab_notes/code_measurements.md: context blocks).
CONTEXT_BLOCK = 16  # tokens of context priced alike


def expected_tokens(run_probability: np.ndarray, limits: np.ndarray, k_max: int) -> np.ndarray:
    """Expected tokens committed per round summed over rows, for K = 0..k_max [k_max+1].

    run_probability [B, k_max]: per row, P(its first i draft tokens are accepted), i = 1..k_max;
    limits [B]: most tokens a row can propose (a free draft's found continuation, else k_max).
    """
    positions = np.arange(1, k_max + 1)  # [k_max]
    kept = np.minimum(limits[:, None], np.arange(k_max + 1)[None, :])  # [B, K+1]: tokens row b keeps at K
    counted = positions[None, None, :] <= kept[:, :, None]  # [B, K+1, k_max]
    return len(limits) + (run_probability[:, None, :] * counted).sum(axis=(0, 2))


class PricedK:
    """`draft.k=auto` for a chain: each round's K maximises expected tokens per second under the cost model,
    with the acceptance of `AcceptanceEstimate` (k_policy/acceptance.py). Seconds come from the hardware profile:
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
                 prior: float = 0.3, prior_weight: float = 2.0,
                 prior_counts: tuple[np.ndarray, np.ndarray] | None = None,
                 prior_cap: float = 16.0, fill_seconds: float = 0.0, prompt_weight: float = 8.0, probe_every: int = 8,
                 margin: float = 0.05):
        self.pass_seconds, self.draft_seconds, self.margin = pass_seconds, np.asarray(draft_seconds), margin
        self.free = free_groups > 0  # a free draft's tokens cost the same however many are kept: it proposes k_max
        self.k_max = len(self.draft_seconds) - 1
        self.estimate = AcceptanceEstimate(self.k_max, max(free_groups, 1), self.free, prior, prior_weight,
                                           prior_counts, prior_cap, prompt_weight)
        self.fill_seconds, self.probe_every = fill_seconds, probe_every
        self.rounds = 0

    def begin(self, batch_size: int, k_max: int, max_new_tokens: int) -> None:
        if k_max != self.k_max:
            raise ValueError(f"the policy was built for k_max={self.k_max}, the draft proposes up to {k_max}")
        self.estimate.begin(batch_size)
        self.memo, self.memo_round = {}, self.rounds  # decisions by their inputs, made since memo_round
        self.max_new_tokens, self.first_lengths = max_new_tokens, None
        self.drafted = False  # the draft proposed in this batch (its fill is paid)
        self.pays_until = 0  # a free draft is asked without checking until this round
        # a model draft that declined is not asked again before the next probe round, because declining teaches
        # it nothing and pricing its rounds anew is not free (docs/lab_notes/code_measurements.md: K policy pricing)
        self.declining = False

    def _rate(self, run_probability: np.ndarray, limits: np.ndarray, seconds: np.ndarray,
              remaining: float) -> np.ndarray:
        """Tokens per second at K = 0..k_max [k_max+1]; before the draft's first proposal of the batch
        a K > 0 also pays its fill, per token the batch has left (``remaining``)."""
        tokens = expected_tokens(run_probability, limits, self.k_max)  # [k_max+1]
        if not self.drafted and self.fill_seconds:
            seconds = seconds + np.r_[0.0, np.full(self.k_max, self.fill_seconds / max(remaining, 1.0))] * tokens
        return tokens / seconds

    def _memo(self, key: tuple, decide: Callable[[], object]) -> object:
        """A decision made for the same rows, groups, limits and prices within the last
        ``probe_every`` rounds, else made now, because estimates move little in a few rounds and pricing
        every K each round is a share of the round worth saving (docs/lab_notes/code_measurements.md:
        K policy memo)."""
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
            estimated = self.estimate.acceptance()[np.nonzero(active)[0], group]  # [B', k_max]
            rate = self._rate(np.cumprod(estimated, axis=-1), limits, seconds, remaining)
            optimistic = self._rate(np.cumprod(self.estimate.optimistic(estimated, group), axis=-1), limits, seconds,
                                    remaining)
            k += int(optimistic[k + 1] > rate[k])
        return k

    def _best_k(self, active: np.ndarray, group: np.ndarray, limits: np.ndarray, seconds: np.ndarray,
                remaining: float) -> int:
        """The K with the most tokens per second for these rows; a K other than the run's own best
        (pooled over prompts and groups) only when it promises ``margin`` more: estimates this
        close are within their noise, and each switch to a longer pass is paid for surely."""
        estimated = self.estimate.acceptance()[np.nonzero(active)[0], group]  # [B', k_max]
        rate = self._rate(np.cumprod(estimated, axis=-1), limits, seconds, remaining)
        pooled = np.broadcast_to(self.estimate.pooled(), estimated.shape)
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
        estimated = self.estimate.acceptance()[rows]  # [B', G, k_max]
        hopeful = np.stack([self.estimate.optimistic(estimated[:, g], np.full(len(rows), g))
                            for g in range(self.estimate.groups)], 1)
        run_probability = np.cumprod(hopeful, axis=-1).max(1)  # [B', k_max]
        rate = self._rate(run_probability, np.full(len(rows), self.k_max), seconds, remaining)
        return bool(rate[1:].max() > (len(rows) / (seconds[0] - self.draft_seconds[-1])))

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
        self.estimate.count(seen)
        self.drafted = True


def priced_policy(profile: Profile | None, draft: str, drafter) -> KPolicy:
    """draft.k=auto: each round's K (a dynamic tree's node budget) chosen by the cost model from ``profile``."""
    if profile is None:
        raise UserInputError("draft.k=auto needs a hardware profile; set profile.enabled=true or give profile.path")
    k_max, shared = drafter.traits.k_max, drafter.traits.shares_target_pass
    sizes = np.arange(1, k_max + 2)  # a round with K = 0..k_max draft tokens passes K + 1

    @functools.lru_cache(maxsize=512)
    def priced(block: int) -> np.ndarray:
        context = block * CONTEXT_BLOCK
        seconds = profile.pass_s(sizes, context, draft if shared else None)
        seconds[0] = profile.pass_s(1, context)  # K = 0: the target's own pass
        return seconds + profile.overhead_s

    def pass_seconds(context: int) -> np.ndarray:  # priced once per block of contexts: a round's choice stays cheap
        return priced(context // CONTEXT_BLOCK)

    if drafter.traits.grows_trees:  # the node budget of a dynamic tree
        return PricedTreeK(pass_seconds, profile.draft_s(draft, np.arange(k_max + 1)),
                           prior_counts=profile.slot_counts(draft))
    return PricedK(pass_seconds, profile.draft_s(draft, np.arange(k_max + 1)),
                   free_groups=drafter.traits.proposal_groups,
                  prior_counts=profile.acceptance_counts(draft), fill_seconds=profile.reset_s(draft))
