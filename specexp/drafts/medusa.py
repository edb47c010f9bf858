"""`draft=medusa`: Medusa heads (`drafts/parts/medusa_heads.py`) propose the k tokens after the tip at
once from the target's last committed hidden state (`Context.features`, the slot before the tip,
which the verify pass that chose the tip computed): a chain of the heads' draws, or a dynamic
token tree whose level d draws from head d (the heads' q's do not depend on the tokens drafted
before them, so expanding a node costs nothing; the tree is grown by `drafts/parts/dynamic_tree.py`).
No draft state is kept between rounds.
"""

from pathlib import Path

import torch

from specexp.core.interface import Context, DraftTraits, Proposal, StepCompiler
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.draft_vocab import sample_draft
from specexp.drafts.parts.base import check_k
from specexp.drafts.parts.dynamic_tree import check_tree, grow_tree
from specexp.drafts.parts.medusa_heads import MedusaHeads
from specexp.errors import UserInputError
from specexp.models import LoadedModel

SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "medusa-smollm2-135m"  # draft.head=medusa


class MedusaDrafter:
    """Chains (``branches`` = 1) or dynamic trees of ``k`` nodes, at most one level per head."""

    def __init__(self, target: LoadedModel, heads: MedusaHeads, k: int = 3, branches: int = 1,
                 depth: int | None = None):
        check_k(k)
        check_tree(branches, depth)
        if branches == 1 and k > heads.n_heads:
            raise UserInputError(f"draft.k={k} is not allowed for a chain of {heads.n_heads} Medusa heads; give "
                                 f"1..{heads.n_heads} (draft.k_max too with auto), or a tree (draft.branches >= 2)")
        self.branches, self.heads = branches, heads
        self.depth = min(depth or heads.n_heads, heads.n_heads)
        self.traits = DraftTraits(k_max=k, models=(heads,), branches=branches, grows_trees=branches > 1,
                                  k_limit=heads.n_heads if branches == 1 else None,  # a chain: one token per head
                                  hidden_layers=tuple(heads.hidden_layers))
        self.head_logits = heads  # (features [B, F], n heads) -> logits [B, n, C]

    def compile_steps(self, compiler: StepCompiler) -> None:
        self.head_logits = compiler.function(self.heads, "draft")

    def reset(self, ctx: Context) -> None:
        pass

    def _logits(self, ctx: Context, n_heads: int) -> torch.Tensor:
        """The first n_heads heads' logits [B, n, C] at the last slot with features (before the tip)."""
        slot = (ctx.lengths - 2).clamp_min(0)  # a one-token prompt has none: any draft is exact
        features = ctx.features.gather(1, slot[:, None, None].expand(-1, 1, ctx.features.shape[-1]))[:, 0]  # [B, F]
        return self.head_logits(features, n_heads)

    @torch.inference_mode()
    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        if self.branches > 1:
            return self._propose_tree(ctx, k, sampling, generator)
        logits = self._logits(ctx, k)  # [B, K, C]
        draws = [sample_draft(logits[:, i], self.heads.draft_vocab, sampling, generator) for i in range(k)]
        return Proposal(tokens=torch.stack([x for x, _ in draws], 1), probs=torch.stack([q for _, q in draws], 1),
                        n_proposed=torch.full_like(ctx.lengths, k))

    def _propose_tree(self, ctx: Context, k: int, sampling: SamplingConfig,
                      generator: torch.Generator | None) -> Proposal:
        logits = self.heads.target_logits(self._logits(ctx, self.depth)).float()  # [B, D, V]
        raw, q = logits.softmax(-1), logits_to_probs(logits, sampling)

        def expand(nodes, tokens, parents, depth):  # every node at this depth draws its children from head `depth`
            e = nodes.shape[1]
            return raw[:, depth, None].expand(-1, e, -1), q[:, depth, None].expand(-1, e, -1)

        tree = grow_tree(raw[:, 0], q[:, 0], expand, self.branches, k, self.depth, sampling, generator)
        n_proposed = torch.full_like(ctx.lengths, tree.tokens.shape[1])
        return Proposal(tokens=tree.tokens, probs=tree.probs, n_proposed=n_proposed, parents=tree.parents)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass


def medusa_drafter(target: LoadedModel, head: str = "medusa", k: int = 3, branches: int = 1,
                   depth: int | None = None) -> MedusaDrafter:
    """`draft=medusa`: draft.head = medusa (shipped for the default target) | a head folder."""
    folder = SHIPPED if head == "medusa" else Path(str(head))
    if head == "medusa" and not folder.is_dir():
        raise UserInputError("no 'medusa' heads ship in this install; give a head folder (python -m specexp.distill "
                             "student=medusa)")
    heads = MedusaHeads.load(folder, target).to(target.model.device, target.model.dtype)
    return MedusaDrafter(target, heads, k=k, branches=branches, depth=depth)
