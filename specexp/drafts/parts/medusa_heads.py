"""Medusa heads (Cai et al. 2024): K heads over the target's last hidden state; head i, read at the
position of token t, proposes token t+2+i (the target's own head gives t+1).

Each head is a stack of residual SiLU blocks (zero-initialised: a fresh head starts as the LM
head it feeds); the heads share one LM head: the target's own (frozen, not saved), or with a
draft vocabulary a trained one over its N kept tokens + "other", started from the target's rows.
Medusa-1 gives every head an LM head of its own; one shared head keeps K heads over a 49k
vocabulary within a few MB, and the cut vocabulary keeps K head products cheap on a CPU.
Saved as ``medusa_head.json`` + ``medusa_head.safetensors`` (+ ``draft_vocab.json``).
"""

import torch
from torch import nn

from specexp.draft_vocab import DraftVocab, restricted_head
from specexp.drafts.parts.feature_head import FeatureHead, Prediction
from specexp.errors import UserInputError
from specexp.models import LoadedModel

DECAY = 0.8  # Medusa's loss weight per head further ahead (head i: DECAY^i)


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b): W starts at zero, so the block starts as the identity."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(FeatureHead):
    """features [.., H] (one layer: the target's normed last state) -> logits [.., n_heads, C]."""

    kind = "medusa"
    student = "medusa"

    def __init__(self, target: LoadedModel, hidden_layers: tuple[int, ...] | None = None,
                 draft_vocab: DraftVocab | None = None, n_heads: int = 4, n_blocks: int = 1):
        n_layers = target.model.config.get_text_config().num_hidden_layers
        super().__init__(target, hidden_layers or (n_layers,), draft_vocab)
        if len(self.hidden_layers) != 1:
            raise UserInputError(f"Medusa heads read one layer's state; hidden_layers={list(self.hidden_layers)}")
        if n_heads < 1 or n_blocks < 1:
            raise UserInputError(f"student.n_heads={n_heads}, student.n_blocks={n_blocks} are not allowed; "
                                 f"both must be >= 1")
        self.n_heads, self.n_blocks = n_heads, n_blocks
        self.blocks = nn.ModuleList(nn.Sequential(*(ResidualBlock(self.hidden_size) for _ in range(n_blocks)))
                                    for _ in range(n_heads))
        self._target_head = (target.model.get_output_embeddings(),)
        self.lm_head = None
        if draft_vocab is not None:
            self.lm_head = restricted_head(self._target_head[0].weight, draft_vocab)  # [N+1, H]
        self.to(device=target.model.device, dtype=target.model.dtype)

    def options(self) -> dict:
        return {"n_heads": self.n_heads, "n_blocks": self.n_blocks}

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0][0].linear.weight.dtype

    def forward(self, features: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """features [..., H] -> logits [..., heads, C] of the first ``heads`` heads (all by default)."""
        features = features.to(self.dtype)
        head = self.lm_head if self.lm_head is not None else self._target_head[0]  # the target's may be bf16
        return torch.stack([head(block(features).to(head.weight.dtype))
                            for block in self.blocks[: heads or self.n_heads]], dim=-2)

    def predictions(self, input_ids: torch.Tensor, features: torch.Tensor) -> list[Prediction]:
        """Head i over the features at t = 0..T-2-i predicts the teacher's positions 1+i..T-1."""
        T = features.shape[1]
        logits = self(features)  # [B, T, K, C]
        return [Prediction(f"head{i + 1}", logits[:, : T - 1 - i, i], 1 + i, DECAY**i) for i in range(self.n_heads)
                if T - 1 - i > 0]
