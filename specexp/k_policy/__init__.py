"""The K policy's home: how many tokens each round drafts when `draft.k` names a policy rather than a number.

A policy is conf/k_policy/NAME.yaml, whose `_target_` builds it for a draft from (this machine's hardware
profile, the draft's profile entry, the drafter): `auto` (priced.py: the cost model's choice each round, a
chain's K by `PricedK` or a dynamic tree's node budget by `PricedTreeK` in tree.py, both from the
acceptance estimate in acceptance.py) and `heuristic` (heuristic.py: HF's schedule). The engine's side of
the contract, `KPolicy`, is core/k_policy.py.
"""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specexp.core.k_policy import KPolicy
from specexp.costs.hardware_profile import Profile
from specexp.errors import UserInputError
from specexp.paths import CONFIG_DIR

POLICY_DIR = Path(CONFIG_DIR) / "k_policy"


def policy_names() -> list[str]:
    """The K policies draft.k may name: conf/k_policy/*.yaml."""
    return sorted(p.stem for p in POLICY_DIR.glob("*.yaml"))


def policy_config(name: str) -> DictConfig:
    """conf/k_policy/NAME.yaml: the `_target_` of the K policy draft.k=NAME builds."""
    if name not in policy_names():
        raise UserInputError(f"draft.k={name} is not allowed; give an integer >= 1 (0: never propose, the A/A "
                             f"control), or one of: {', '.join(policy_names())}")
    return OmegaConf.load(POLICY_DIR / f"{name}.yaml")


def make_policy(name: str | None, profile: Profile | None, draft: str, drafter) -> KPolicy | None:
    """The K policy ``draft.k=NAME`` names, for this draft; None: K fixed."""
    from hydra.utils import instantiate

    if name is None:
        return None
    return instantiate(policy_config(name))(profile, draft, drafter)
