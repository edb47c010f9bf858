"""K policies wired to a study: `draft.k=NAME` builds conf/k_policy/NAME.yaml's `_target_` (auto: the
cost model's choice each round, `core/k_policy.ModelK`, or a dynamic tree's node budget,
`core/tree_policy.TreeK`, priced with this machine's profile; heuristic: HF's
num_assistant_tokens_schedule, `core/k_policy.HeuristicK`). drafts/build.py reads which one a config asks for."""

import functools

import numpy as np

from specexp.core.k_policy import HeuristicK, KPolicy, ModelK
from specexp.core.tree_policy import TreeK
from specexp.costs.hardware_profile import Profile
from specexp.drafts.build import policy_config
from specexp.errors import UserInputError

CONTEXT_BLOCK = 16  # tokens of context priced alike (T(n, L) moves ~1% per 100 tokens here)


def make_policy(name: str | None, profile: Profile | None, draft: str, drafter) -> KPolicy | None:
    """The K policy ``draft.k=NAME`` names (conf/k_policy/NAME.yaml), for this draft; None: K fixed."""
    from hydra.utils import instantiate

    if name is None:
        return None
    return instantiate(policy_config(name))(profile, draft, drafter)


def heuristic_policy(profile: Profile | None, draft: str, drafter) -> KPolicy:
    """draft.k=heuristic: HF's schedule (no profile needed)."""
    return HeuristicK()


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
        return TreeK(pass_seconds, profile.draft_s(draft, np.arange(k_max + 1)), prior_counts=profile.slot_counts(draft))
    return ModelK(pass_seconds, profile.draft_s(draft, np.arange(k_max + 1)), free_groups=drafter.traits.proposal_groups,
                  prior_counts=profile.acceptance_counts(draft), fill_seconds=profile.reset_s(draft))
