"""The acceptance `draft.k=auto` prices rounds with: per draft position (and, for a free draft, per the group
its proposal names), counted over the run so far from a prior, and scaled per prompt."""

import numpy as np

from specexp.core.interface import RoundSeen
from specexp.core.metrics import position_counts


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


class AcceptanceEstimate:
    """Acceptance is estimated online per draft position (and, for a free draft, per the group its proposal
    names: prompt lookup's n-gram match length). Counts over the whole run so far, started from the draft's
    acceptance in the hardware profile (``prior_counts``; else a weak flat ``prior``), give the curve; each
    prompt's own acceptance so far scales it (not for a free draft, whose groups already tell an easy
    context from a hard one)."""

    def __init__(self, k_max: int, groups: int = 1, free: bool = False, prior: float = 0.3, prior_weight: float = 2.0,
                 prior_counts: tuple[np.ndarray, np.ndarray] | None = None, prior_cap: float = 16.0,
                 prompt_weight: float = 8.0):
        self.k_max, self.groups, self.free = k_max, groups, free
        self.prior, self.prior_n = prior_curve(k_max, prior_counts, prior, prior_weight, prior_cap)  # [k_max] each
        self.prior_weight, self.prompt_weight = prior_weight, prompt_weight
        self.accepted = np.zeros((groups, k_max))  # over the run: position i accepted
        self.reached = np.zeros((groups, k_max))  # over the run: position i looked at by the rule

    def begin(self, batch_size: int) -> None:
        """A new batch: each row's own counts start over."""
        self.row_accepted = np.zeros((batch_size, self.groups, self.k_max))
        self.row_reached = np.zeros((batch_size, self.groups, self.k_max))
        self.estimates = None

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
        if self.estimates is None:  # once per round: count() invalidates
            prior_accepted = self.prior_n * self.prior  # [k_max]
            pooled = (self.accepted.sum(0) + prior_accepted) / (self.reached.sum(0) + self.prior_n)  # [k_max]
            overall = (self.accepted.sum() + prior_accepted.sum()) / (self.reached.sum() + self.prior_n.sum())
            # A cell seen little leans on its group over all positions where there are groups (prompt
            # lookup's match lengths differ more than its positions: pooling over groups made a rare
            # long match look like the common 1-token one), else on the run's curve.
            if self.groups > 1:
                within = (self.accepted.sum(1) + self.prompt_weight * overall) / \
                    (self.reached.sum(1) + self.prompt_weight)
                toward = within[:, None]  # [G, 1]
            else:
                toward = pooled[None]  # [1, k_max]
            run = (self.accepted + self.prior_weight * toward) / (self.reached + self.prior_weight)  # [G, k_max]
            prompt = (self.row_accepted.sum((1, 2)) + self.prompt_weight * overall) / \
                (self.row_reached.sum((1, 2)) + self.prompt_weight)  # [B]
            if self.free:  # its groups already tell an easy context from a hard one
                prompt = np.full_like(prompt, overall)
            # [B, G, k_max]
            scaled = odds(np.clip(run, 1e-6, 0.99))[None] * (odds(prompt) / odds(overall))[:, None, None]
            self.estimates = np.minimum(scaled / (1 + scaled), 0.99), pooled
        return self.estimates[0]

    def optimistic(self, estimated: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Acceptance two standard errors above the estimates [B', k_max] (the run's counts behind
        each row's group, the prior's worth included)."""
        n = self.reached[group] + self.prior_n  # [B', k_max]
        return np.minimum(estimated + 2 * np.sqrt(estimated * (1 - estimated) / (n + 1)), 0.99)

    def pooled(self) -> np.ndarray:
        """The run's acceptance per position over every group and prompt [k_max]."""
        self.acceptance()
        return self.estimates[1]

    def count(self, seen: RoundSeen) -> None:
        """What a round's rule accepted of what was proposed, per row, its group and position."""
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
