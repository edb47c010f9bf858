"""How a model's step runs, the same for the AR baseline and every draft so ratios stay fair.

- `runtime=lean` (default, `runtime/lean.py`): the lean decoder forward (`runtime/decoder.py`) over a
  static ragged cache (`core/kv.py`) for the target and every Llama-shaped model draft, with fused
  q/k/v and gate/up weights.
- `runtime=hf` (here): transformers' own forward for the target, for any architecture, and the
  reference the lean forward is tested against; what a prepared runtime hands a study; the row
  counts a round's passes take and the models a draft runs.

Both write every Linear they run the way this machine's matmul plan chose for the row counts the
run will use (`runtime/matmul.py`).
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import nn

from specexp.core.interface import Drafter
from specexp.errors import UserInputError
from specexp.models import LoadedModel, spread_over_devices
from specexp.paths import cache_root
from specexp.runtime.compiled import CompiledDecoder, StepCompiler, bucket
from specexp.runtime.decoder import existing_decoder
from specexp.runtime.int8 import Int8WeightLinear
from specexp.runtime.matmul import MatmulPlans, apply_plan

# torch.compile's: code generated, the capture alone, and autograd's
COMPILE_BACKENDS = ("inductor", "eager", "aot_eager")


def round_rows(batch_size: int, k: int) -> list[int]:
    """Rows of x in a target pass of a decoding round: b rows (any batch up to batch_size: the
    last batch of a category may be smaller) times 1..K+1 tokens (drafts may propose fewer)."""
    return sorted({b * n for b in range(1, batch_size + 1) for n in range(1, k + 2)})


@dataclass
class PreparedRuntime:
    forward: Callable  # what the engine runs the target through: the model, or its lean decoder
    record: dict  # the settings and the matmul plan, for summary.json
    # runtime.compile=true: the forward, compiled (its graphs warmed before timing, its eager decoder for
    # one-off passes); None: the forward runs eagerly
    compiled: CompiledDecoder | None = None
    # runtime.compile=true: what compiled the target's and the draft's steps (its counters in summary.json)
    compiler: StepCompiler | None = None


@dataclass
class HFRuntime:
    """runtime=hf: transformers' forward for the target; ``matmul_plan`` writes each Linear of the
    target and of the draft's own models as the machine's plan says for row counts up to
    ``max_planned_rows`` (F.linear above them)."""

    matmul_plan: bool = True
    max_planned_rows: int = 64

    def __post_init__(self):
        if self.max_planned_rows < 1:
            raise UserInputError(f"runtime.max_planned_rows={self.max_planned_rows} is not allowed; it must be >= 1")

    def target_forward(self, target: LoadedModel) -> tuple[Callable, dict]:
        return target.model, {"name": "hf"}

    def prepare(self, target: LoadedModel, drafter: Drafter | None, rows: Iterable[int]) -> PreparedRuntime:
        """Set the target and the draft's own models up for a run whose passes have these row
        counts (after the draft is built: its lean decoders are planned too)."""
        forward, record = self.target_forward(target)
        record |= {"matmul_plan": self.matmul_plan, "max_planned_rows": self.max_planned_rows,
                   "draft_int8_linears": sum(isinstance(m, Int8WeightLinear)  # draft.quantize's choice
                                             for model in draft_models(drafter) for m in model.modules())}
        if self.matmul_plan and spread_over_devices(target.model):
            # accelerate's hooks (moving inputs, loading offloaded weights) sit on each module's forward
            record |= {"matmul_plan": False, "matmul_plan_skipped": "the target is spread over devices (device_map)"}
        elif self.matmul_plan:
            if record.get("compile"):  # compiled passes pad their tokens to a bucket (exact for batch 1)
                rows = set(rows) | {bucket(m) for m in rows}
            planned = sorted(m for m in rows if m <= self.max_planned_rows)
            models = [target.model, *draft_models(drafter)]
            record |= apply_plan(with_decoders(models), MatmulPlans(cache_root() / "plans", target.model.device),
                                 planned)
        return PreparedRuntime(forward, record)


def draft_models(drafter: Drafter | None) -> list[nn.Module]:
    """The models a draft runs, as it declares them (``traits.models``: a small LM, an exit head).
    Int8 layers are not nn.Linear and keep their own kernel."""
    return [] if drafter is None else list(drafter.traits.models)


def with_decoders(models: list[nn.Module]) -> list[nn.Module]:
    """The models and the Linears of their lean decoders (fused ones are not in the model's tree)."""
    decoders = [existing_decoder(model) for model in models]
    return models + [nn.ModuleList(d.linears()) for d in decoders if d is not None]
