"""How a model's step runs, the same for the AR baseline and every draft so ratios stay fair.

Today one runtime, `runtime=hf`: transformers' own forward, with every Linear of the target
and of the draft's models written the way this machine's matmul plan chose for the row counts
the run will use (`specexp/runtime/matmul.py`).
"""

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from specexp.errors import UserInputError
from specexp.models import LoadedModel, cache_root
from specexp.runtime.matmul import MatmulPlans, apply_plan


def round_rows(batch_size: int, k: int) -> list[int]:
    """Rows of x in a target pass of a decoding round: b rows (any batch up to batch_size: the
    last batch of a category may be smaller) times 1..K+1 tokens (drafts may propose fewer)."""
    return sorted({b * n for b in range(1, batch_size + 1) for n in range(1, k + 2)})


@dataclass
class HFRuntime:
    """runtime=hf: transformers' forward; ``matmul_plan`` writes each Linear of the target and of
    the draft's own models as the machine's plan says for row counts up to ``max_planned_rows``
    (F.linear above them)."""

    matmul_plan: bool = True
    max_planned_rows: int = 64

    def __post_init__(self):
        if self.max_planned_rows < 1:
            raise UserInputError(f"runtime.max_planned_rows={self.max_planned_rows} is not allowed; it must be >= 1")

    def prepare(self, target: LoadedModel, drafter: object | None, rows: Iterable[int]) -> dict:
        """Set the target and the draft's own models up for a run whose passes have these row
        counts; returns the settings and the plan for the run's record."""
        record = {"name": "hf", "matmul_plan": self.matmul_plan, "max_planned_rows": self.max_planned_rows}
        if self.matmul_plan:
            planned = [m for m in rows if m <= self.max_planned_rows]
            models = [target.model, *draft_models(drafter)]
            record |= apply_plan(models, MatmulPlans(cache_root() / "plans", target.model.device), planned)
        return record


def draft_models(drafter: object | None) -> list[nn.Module]:
    """The models a draft runs: the nn.Modules and LoadedModels among its attributes (a small LM,
    an exit head). Int8 layers are not nn.Linear and keep their own kernel."""
    found = []
    for value in vars(drafter).values() if drafter is not None else ():
        value = value.model if isinstance(value, LoadedModel) else value
        if isinstance(value, nn.Module):
            found.append(value)
    return found
