"""`draft=none`: a draft that never proposes, the speculative arm's A/A control.

Every round of the speculative arm is then a plain AR step (K = 0) through the same engine, the
same runtime and the same bookkeeping as the baseline, so the study's speedup is the measurement's
own bias and noise: it must come out 1.00 within its interval (`experiment=aa_control`).
`draft.k=0` does the same for any draft (built as configured, then never asked), which adds
that draft's per-batch costs (its reset, a feature draft's hidden states) to the control.
"""

import torch

from specexp.core.interface import Context, DraftTraits, Proposal
from specexp.core.sampling import SamplingConfig
from specexp.errors import UserInputError
from specexp.models import LoadedModel


class NoDrafter:
    traits = DraftTraits(k_max=0)  # the engine never asks for a proposal

    def __init__(self, target: LoadedModel, k: int = 0):
        if k != 0:
            raise UserInputError(f"draft.k={k} is not allowed for draft=none; it never proposes (k=0)")
        self.vocab_size = target.vocab_size

    def reset(self, ctx: Context) -> None:
        pass

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        return Proposal.empty(ctx.tokens.shape[0], self.vocab_size, ctx.tokens.device)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass
