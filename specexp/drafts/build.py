"""A draft config made into a drafter for a target, as a study builds it: `draft.k` read (a number,
or a K policy's name: then the draft is built for `k_max` tokens), the keys that describe the draft
rather than configure it (`name`, `card`) set aside, the rest instantiated with the target."""

from dataclasses import dataclass

from omegaconf import DictConfig, open_dict

from specexp.core.interface import Drafter
from specexp.drafts.registry import DESCRIBING_KEYS, draft_name
from specexp.errors import UserInputError

DEFAULT_K_MAX = 8


def resolve_draft_k(draft_cfg: DictConfig) -> tuple[DictConfig, str | None]:
    """The draft config to build and the K policy (None: a fixed K). With a policy the draft is
    built for ``k_max`` tokens, and the options its card hands to the policy (``card.with_k_policy``:
    prompt lookup's caps after short matches, which are the policy's choice too) take the card's
    values where the config leaves them unset."""
    draft_cfg = draft_cfg.copy()
    k = draft_cfg.get("k")
    with open_dict(draft_cfg):
        card = draft_cfg.get("card")
        for key in DESCRIBING_KEYS:
            draft_cfg.pop(key, None)
        k_max = draft_cfg.pop("k_max", DEFAULT_K_MAX)
        tree = draft_cfg.pop("tree", None)
        if tree is not None:  # a token tree's size is its node budget: draft.k=auto prices it (k_policy/tree.py)
            if tree != "auto":
                raise UserInputError(f"draft.tree={tree} is not allowed; give auto (the node budget and depth chosen "
                                     "each round) or null (draft.k nodes)")
            if draft_cfg.get("branches", 1) < 2:
                raise UserInputError(f"draft.tree=auto sizes a token tree; give draft.branches >= 2 "
                                     f"(draft.branches={draft_cfg.get('branches', 1)})")
            k = "auto"
        if not isinstance(k, str):
            if k is not None and (not isinstance(k, int) or k < 0):  # 0 is the A/A control: built, never asked
                raise UserInputError(f"draft.k={k} is not allowed; give an integer >= 1 (0: never propose, the A/A "
                                     "control), or a K policy's name (conf/k_policy/)")
            return draft_cfg, None
        if not isinstance(k_max, int) or k_max < 1:
            raise UserInputError(f"draft.k_max={k_max} is not allowed; it must be an integer >= 1")
        draft_cfg.k = k_max
        # the draft's own unset options a policy takes over
        for key, value in ((card or {}).get("with_k_policy") or {}).items():
            if draft_cfg.get(key) is None:
                draft_cfg[key] = value
    return draft_cfg, k


@dataclass
class BuiltDraft:
    drafter: Drafter
    policy: str | None  # the K policy's name; None: K fixed
    config: DictConfig  # the config it was built from
    k_max: int  # most draft tokens a round asks: its traits.k_max, or 0 for draft.k=0 (never asked)
    name: str  # the config's `name` (conf/draft/NAME.yaml's; a draft without one: its _target_'s last part)


def check_draft_arguments(resolved: DictConfig, name: str) -> None:
    """A key the draft's constructor does not take (``+draft.kk=3``) is one line naming it and the keys it takes."""
    import inspect

    from hydra.utils import get_object

    try:
        constructor = get_object(str(resolved.get("_target_")))
    except Exception as error:  # Hydra's ImportError words name the module it could not import
        raise UserInputError(f"draft={name}: _target_ '{resolved.get('_target_')}' cannot be imported "
                             f"({error})") from None
    parameters = list(inspect.signature(constructor).parameters.values())[1:]  # the first is the target, given at build
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    takes = [p.name for p in parameters]
    for key in resolved:
        if not str(key).startswith("_") and key not in takes:
            raise UserInputError(f"draft={name} takes no key '{key}'; its keys: {', '.join(['k_max', 'tree', *takes])}")


def check_draft_config(draft_cfg: DictConfig) -> str | None:
    """Everything a draft config can be wrong in that needs no model: draft.k, its policy's keys, and keys its
    constructor does not take (each a UserInputError line). Returns the K policy draft.k names (None: K fixed)."""
    resolved, policy = resolve_draft_k(draft_cfg)
    check_draft_arguments(resolved, draft_name(draft_cfg))
    return policy


def build_draft(draft_cfg: DictConfig, target) -> BuiltDraft:
    """The drafter a draft config makes for this target, as a study builds it."""
    from hydra.utils import instantiate  # Hydra's import costs seconds: only a build needs it

    resolved, policy = resolve_draft_k(draft_cfg)
    check_draft_arguments(resolved, draft_name(draft_cfg))
    never = policy is None and resolved.get("k") == 0  # draft.k=0: the A/A control with this draft built
    if never:
        with open_dict(resolved):
            resolved.pop("k")  # built at its own default K, then never asked
    drafter = instantiate(resolved)(target)
    traits = drafter.traits
    if policy is not None and traits.branches > 1 and (policy != "auto" or not traits.grows_trees):
        raise UserInputError(f"draft.k={policy} prices chains, and with auto the dynamic trees of a draft that grows "
                             f"them (traits.grows_trees); this token tree (draft.branches={traits.branches}) takes a "
                             "fixed node budget, e.g. draft.k=8")
    return BuiltDraft(drafter, policy, resolved, 0 if never else traits.k_max, draft_name(draft_cfg))
