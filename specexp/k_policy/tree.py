"""`draft.k=auto` for a draft that grows dynamic token trees: each round's node budget N from the
cost model.

A dynamic tree is grown in a fixed order of slots (drafts/parts/dynamic_tree.py: the root's children,
then level by level, the best expanded node's children first), and a budget of N nodes keeps the
first N slots. The accepted length is the number of tree nodes on the accepted path, so by
linearity a tree of N nodes accepts sum_{s < N} P(slot s on the path) tokens in expectation:
one measured rate per slot prices every budget. (A smaller budget can expand other nodes of a
later level than a larger one does, so the rates of its later slots are estimates, not identities.)
Seconds per round are the target's pass over N + 1 tokens and the draft's cost of growing N
nodes, both from the hardware profile.
"""

from collections.abc import Callable

import numpy as np

from specexp.core.interface import Context, Proposal, RoundSeen
from specexp.core.metrics import slot_counts
from specexp.k_policy.acceptance import prior_curve


class PricedTreeK:
    """Each round's node budget (0: no draft) maximises expected tokens per second: 1 + the summed
    slot rates of the first N slots, over the round's priced seconds. Slot rates are counted over
    the run, started from the draft's slot rates in the hardware profile (its own short decodes,
    worth at most ``prior_cap`` observations; else a weak ``prior``). A budget of N never reaches
    later slots, so every ``probe_every``-th round takes one node more where its rate two standard
    errors up would pay; decisions are kept for ``probe_every`` rounds per price."""

    def __init__(self, pass_seconds: Callable[[int], np.ndarray], draft_seconds: np.ndarray,
                 prior_counts: tuple[np.ndarray, np.ndarray] | None = None, prior: float = 0.1,
                 prior_weight: float = 2.0, prior_cap: float = 16.0, probe_every: int = 8):
        self.pass_seconds, self.draft_seconds = pass_seconds, np.asarray(draft_seconds)
        self.k_max = len(self.draft_seconds) - 1
        self.prior, self.prior_n = prior_curve(self.k_max, prior_counts, prior, prior_weight, prior_cap)  # [k_max]
        self.accepted, self.reached = np.zeros(self.k_max), np.zeros(self.k_max)
        self.probe_every, self.rounds, self.memo, self.memo_round = probe_every, 0, {}, 0

    def begin(self, batch_size: int, k_max: int, max_new_tokens: int) -> None:
        if k_max != self.k_max:
            raise ValueError(f"the policy was built for k_max={self.k_max}, the draft proposes up to {k_max}")

    def rates(self) -> np.ndarray:
        """P(slot s on the accepted path) [k_max]."""
        return (self.accepted + self.prior_n * self.prior) / (self.reached + self.prior_n)

    def tokens_per_second(self, rates: np.ndarray, seconds: np.ndarray) -> np.ndarray:
        """[k_max+1] at N = 0..k_max nodes."""
        return (1.0 + np.r_[0.0, np.cumsum(rates)]) / seconds

    def choose(self, ctx: Context) -> int:
        seconds = self.pass_seconds(int(ctx.on_host().lengths.max())) + self.draft_seconds  # [k_max+1]
        self.rounds += 1
        if self.rounds - self.memo_round >= self.probe_every:
            self.memo, self.memo_round = {}, self.rounds
        key = seconds.tobytes()
        if key not in self.memo:
            self.memo[key] = int(np.argmax(self.tokens_per_second(self.rates(), seconds)))
        n = self.memo[key]
        if n < self.k_max and self.rounds % self.probe_every == 0:
            rates = self.rates()
            optimistic = np.minimum(rates + 2 * np.sqrt(rates * (1 - rates) / (self.reached + self.prior_n + 1)), 1.0)
            n += int(self.tokens_per_second(optimistic, seconds)[n + 1] > self.tokens_per_second(rates, seconds)[n])
        return n

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        return proposal  # the draft grew the budget it was given

    def observe(self, seen: RoundSeen) -> None:
        if seen.n_nodes == 0:
            return
        reached, accepted = slot_counts(seen.n_proposed, seen.path, seen.active, self.k_max)
        self.reached += reached
        self.accepted += accepted
