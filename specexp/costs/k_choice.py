"""`draft.k`: a number, `auto` (the cost model's choice each round, `core/k_policy.ModelK`; of a
dynamic tree's node budget, `core/tree_policy.TreeK`) or `heuristic` (HF's
num_assistant_tokens_schedule, `core/k_policy.HeuristicK`), wired to a study."""

import functools
from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig, open_dict

from specexp.core.interface import Drafter
from specexp.core.k_policy import HeuristicK, KPolicy, ModelK
from specexp.core.tree_policy import TreeK
from specexp.costs.profile import Profile
from specexp.errors import UserInputError

POLICIES = ("auto", "heuristic")
DEFAULT_K_MAX = 8
CONTEXT_BLOCK = 16  # tokens of context priced alike (T(n, L) moves ~1% per 100 tokens here)


def resolve_draft_k(draft_cfg: DictConfig) -> tuple[DictConfig, str | None]:
    """The draft config to build and the K policy (None: a fixed K). With a policy the draft is
    built for ``k_max`` tokens, and a prompt lookup without caps of its own gets none: which
    tokens after a short match are worth verifying is the policy's choice too."""
    draft_cfg = draft_cfg.copy()
    k = draft_cfg.get("k")
    with open_dict(draft_cfg):
        draft_cfg.pop("name", None)  # what reports call it (draft_name), not a constructor's argument
        k_max = draft_cfg.pop("k_max", DEFAULT_K_MAX)
        tree = draft_cfg.pop("tree", None)
        if tree is not None:  # a token tree's size is its node budget: draft.k=auto prices it (TreeK)
            if tree != "auto":
                raise UserInputError(f"draft.tree={tree} is not allowed; give auto (the node budget and depth chosen "
                                     "each round) or null (draft.k nodes)")
            if draft_cfg.get("branches", 1) < 2:
                raise UserInputError(f"draft.tree=auto sizes a token tree; give draft.branches >= 2 "
                                     f"(draft.branches={draft_cfg.get('branches', 1)})")
            k = "auto"
        if not isinstance(k, str):
            return draft_cfg, None
        if k not in POLICIES:
            raise UserInputError(f"draft.k={k} is not allowed; give an integer >= 1, or one of: {', '.join(POLICIES)}")
        if not isinstance(k_max, int) or k_max < 1:
            raise UserInputError(f"draft.k_max={k_max} is not allowed; it must be an integer >= 1")
        draft_cfg.k = k_max
        if "max_tokens_after_match" in draft_cfg and draft_cfg.max_tokens_after_match is None:
            draft_cfg.max_tokens_after_match = []
    return draft_cfg, k


@dataclass
class BuiltDraft:
    drafter: Drafter
    policy: str | None  # the K policy's name; None: K fixed
    config: DictConfig  # the config it was built from
    k_max: int  # most draft tokens a round asks: its traits.k_max, or 0 for draft.k=0 (never asked)
    name: str  # the config's `name` (conf/draft/NAME.yaml's; a draft without one: its _target_'s last part)


def draft_name(draft_cfg: DictConfig) -> str:
    """The config's `name` (conf/draft/NAME.yaml's); a config without one: its _target_'s last part."""
    return str(draft_cfg.get("name") or str(draft_cfg.get("_target_", "")).rsplit(".", 1)[-1])


def build_draft(draft_cfg: DictConfig, target) -> BuiltDraft:
    """The drafter a draft config makes for this target, as a study builds it."""
    from hydra.utils import instantiate

    resolved, policy = resolve_draft_k(draft_cfg)
    never = policy is None and resolved.get("k") == 0  # draft.k=0: the A/A control with this draft built
    if never:
        with open_dict(resolved):
            resolved.pop("k")  # built at its own default K, then never asked
    drafter = instantiate(resolved)(target)
    traits = drafter.traits
    if policy is not None and traits.branches > 1 and (policy != "auto" or not traits.grows_trees):
        raise UserInputError(f"draft.k={policy} prices chains and dynamic trees (draft.k=auto: small_lm, distilled, "
                             f"target_prefix, ngram_lm); this token tree (draft.branches={traits.branches}) takes a "
                             "fixed node budget, e.g. draft.k=8")
    return BuiltDraft(drafter, policy, resolved, 0 if never else traits.k_max, draft_name(draft_cfg))


def make_policy(name: str | None, profile: Profile | None, draft: str, drafter) -> KPolicy | None:
    if name is None:
        return None
    if name == "heuristic":
        return HeuristicK()
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
