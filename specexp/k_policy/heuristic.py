"""`draft.k=heuristic`: transformers' num_assistant_tokens_schedule."""

from specexp.core.interface import Context, Proposal, RoundSeen
from specexp.core.k_policy import KPolicy
from specexp.costs.hardware_profile import Profile


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


def heuristic_policy(profile: Profile | None, draft: str, drafter) -> KPolicy:
    """draft.k=heuristic: HF's schedule (no profile needed)."""
    return HeuristicK()
