"""What a study's config can be wrong in before any model loads (each a one-line UserInputError): the
counts, the device and dtype, draft.k and the K policy it names, and keys the draft's constructor does not
take. `prepare` runs it first; `python -m specexp` runs it on the composed config before Hydra starts."""

from omegaconf import DictConfig

from specexp.drafts.build import check_draft_config
from specexp.errors import UserInputError
from specexp.k_policy import policy_config
from specexp.models import resolve_device, resolve_dtype


def check_study_config(cfg: DictConfig) -> None:
    for key in ("max_new_tokens", "batch_size"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise UserInputError(f"{key}={cfg[key]} is not allowed; it must be an integer >= 1")
    resolve_dtype(cfg.dtype, resolve_device(cfg.device))
    if (policy := check_draft_config(cfg.draft)) is not None:
        policy_config(policy)  # a K policy's name: one of conf/k_policy/
