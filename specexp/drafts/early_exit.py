"""Early-exit self-speculation: the target drafts with its own first L layers and an exit head.

Two modes, for comparison:
- shared (LayerSkip's shared KV cache and exit query cache): drafting writes layers 0..L-1's KV
  of the tip and x_1..x_{K-1} straight into the target's cache and keeps their layer-L hidden
  states; the round's target pass then runs layers 0..L-1 for x_K alone and layers L..N-1 for
  all K+1 positions. The engine's rewind crops every layer alike.
- naive (HF's `assistant_early_exit`): the same layers as a separate draft model with its own
  cache (the `small_lm` drafter over `EarlyExitModel`); the target pass recomputes everything.
"""

from pathlib import Path

import torch

from specexp.core.interface import Context, Drafter, DraftTraits, Proposal, StepCompiler
from specexp.core.kv import RaggedKV, StaticRaggedKV
from specexp.core.sampling import SamplingConfig
from specexp.draft_vocab import sample_draft
from specexp.drafts.parts.base import check_k
from specexp.drafts.parts.exit_head import EarlyExitModel, ExitHead, target_decoder
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.errors import UserInputError
from specexp.models import LoadedModel

MODES = ("shared", "naive")
SHIPPED_HEADS = Path(__file__).resolve().parent.parent / "assets" / "exit-heads-smollm2-135m"


class SharedEarlyExitDrafter:
    """Drafts inside the target's own cache; performs the round's target pass itself (the engine
    calls `attach` after the prompt pass and `target_forward` instead of a full forward).

    Between rounds every layer's cache holds the committed tokens but the tip, as in the engine.
    """

    def __init__(self, target: LoadedModel, head: ExitHead, k: int = 2):
        check_k(k)
        self.target, self.head = target, head
        self.traits = DraftTraits(k_max=k, models=(head,), shares_target_pass=True)
        self.decoder = target_decoder(target.model)
        self.exit_logits = head  # layer-L states [B, H] -> logits [B, C]
        self.kv: RaggedKV | StaticRaggedKV | None = None
        self.exit_hidden: torch.Tensor | None = None  # [B, K, H]: layer-L states of tip, x_1..x_{K-1}

    def compile_steps(self, compiler: StepCompiler) -> None:
        self.decoder = compiler.decoder(self.decoder, "target")  # the target's own compiled layers and cache
        self.exit_logits = compiler.function(self.head, "draft")

    def attach(self, kv: RaggedKV | StaticRaggedKV) -> None:
        self.kv = kv

    def reset(self, ctx: Context) -> None:
        self.exit_hidden = None

    @torch.inference_mode()
    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        B = ctx.tokens.shape[0]
        ones = torch.ones(B, 1, dtype=torch.long, device=ctx.tokens.device)
        mask, position = self.kv.mask, self.kv.n_valid[:, None]  # [B, S], [B, 1]
        x = ctx.tokens.gather(1, ctx.lengths[:, None] - 1)  # [B, 1]: the tip
        tokens, probs, hidden = [], [], []
        for i in range(k):
            mask = torch.cat([mask, ones], dim=1)  # layers 0..L-1 grow one slot per step
            h = self.decoder.run_layers(self.decoder.embed(x), range(self.head.exit_layer), self.kv, mask,
                                        position + i)  # [B, 1, H]
            token, q = sample_draft(self.exit_logits(h[:, -1]), self.head.draft_vocab, sampling,
                                    generator)  # [B], [B, V]
            x = token[:, None]
            tokens.append(x)
            probs.append(q)
            hidden.append(h)
        self.exit_hidden = torch.cat(hidden, dim=1)
        return Proposal(tokens=torch.cat(tokens, dim=1), probs=torch.stack(probs, dim=1),
                        n_proposed=torch.full_like(ctx.lengths, k))

    @torch.inference_mode()
    def target_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The target's logits [B, K+1, V] over [tip, x_1..x_K], computing only what drafting did not."""
        L, N = self.head.exit_layer, self.decoder.n_layers
        positions = self.kv.extend(torch.ones_like(inputs))  # [B, K+1]; every layer ends at these slots
        last = self.decoder.run_layers(self.decoder.embed(inputs[:, -1:]), range(L), self.kv, self.kv.mask,
                                       positions[:, -1:])  # x_K, never drafted from: [B, 1, H]
        hidden = torch.cat([self.exit_hidden, last], dim=1)  # [B, K+1, H] at layer L
        hidden = self.decoder.run_layers(hidden, range(L, N), self.kv, self.kv.mask, positions)
        return self.decoder.logits(hidden)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        self.exit_hidden = None  # the engine's rewind already cropped the shared cache

    def standalone(self) -> Drafter:
        """The same layers and head with a cache of their own (mode=naive): the same drafts, for a
        replay that runs no target pass (tests/drafts/test_early_exit.py checks they are the same)."""
        return naive_early_exit(self.target, self.head, self.traits.k_max)


def resolve_head(target: LoadedModel, head: str, exit_layer: int | None) -> ExitHead:
    """'untrained' (the target's own norm + LM head at exit_layer), 'trained' (the head shipped for
    the default target at exit_layer), or the path of a head folder (its own exit layer)."""
    if head == "untrained":
        if exit_layer is None:
            raise UserInputError("draft.exit_layer is required with draft.head=untrained")
        return ExitHead.untrained(target_decoder(target.model), exit_layer)
    if head == "trained":
        if exit_layer is None:
            raise UserInputError("draft.exit_layer is required with draft.head=trained")
        folder = SHIPPED_HEADS / f"L{exit_layer}"
        if not folder.is_dir():
            shipped = sorted(int(p.name[1:]) for p in SHIPPED_HEADS.glob("L*"))
            raise UserInputError(f"no trained exit head ships for exit_layer={exit_layer}; shipped: {shipped} "
                                 f"(or train one: python -m specexp.distill student=exit_head student.exit_layer=...)")
        head = str(folder)
    loaded = ExitHead.load(head, target)
    if exit_layer is not None and exit_layer != loaded.exit_layer:
        raise UserInputError(f"draft.exit_layer={exit_layer} but the head '{head}' was trained at layer "
                             f"{loaded.exit_layer}; set draft.exit_layer=null to take the head's own, "
                             f"or give a head for that layer")
    return loaded


def early_exit_drafter(target: LoadedModel, exit_layer: int | None = None, k: int = 2, head: str = "untrained",
                       mode: str = "shared") -> Drafter:
    """`draft=early_exit`: exit after layer `exit_layer` through `head`, in `mode` shared or naive."""
    if mode not in MODES:
        raise UserInputError(f"draft.mode='{mode}' is not allowed; choose one of {', '.join(MODES)}")
    exit_head = resolve_head(target, str(head), exit_layer)
    if mode == "shared":
        return SharedEarlyExitDrafter(target, exit_head, k=k)
    return naive_early_exit(target, exit_head, k)


def naive_early_exit(target: LoadedModel, head: ExitHead, k: int) -> SmallLMDrafter:
    """The target's first layers and an exit head as a separate draft model with its own cache."""
    model = EarlyExitModel(target.model, head, target_space_logits=True)
    draft = LoadedModel(model=model, tokenizer=target.tokenizer, name=f"{target.name}-exit{head.exit_layer}")
    return SmallLMDrafter(target, draft, k=k)
