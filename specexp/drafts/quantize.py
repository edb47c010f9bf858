"""Int8 weights for a small-LM draft on a CPU: fewer bytes per draft step, the same exactness.

Verification only needs q to be the distribution the draft sampled from, so a quantized draft
keeps speculative decoding exact; it can only move alpha and c. On a CPU the step of a 2-layer
draft is dominated by streaming its weights, which the target's pass has just evicted from the
caches: int8 weights are a quarter of fp32's bytes.

Weight-only int8 (one scale per output channel) with bf16 activations runs on PyTorch's
``_weight_int8pack_mm`` CPU kernel (the one torchao's int8 weight-only layout dispatches to).
Measured on MT-bench with the distilled draft (benchmarks/draft_quantize.md): greedy agreement
with the target unchanged, c down by a fifth (0.103 -> 0.081 of an AR step). Dynamic int8
(activations quantized too, torch.ao's ``quantize_dynamic``) is faster still but cost 6 points
of agreement (the layers' activation outliers), and torchao's int8 configs ran slower than fp32
in eager mode here.
"""

import copy

import torch
from torch import nn

from specexp.errors import UserInputError

QUANTIZE_SCHEMES = ("int8", "auto")  # null = the draft's own weights; auto = int8 on a CPU, null elsewhere
KERNEL_K_MULTIPLE = 16  # the kernel needs in_features % 16 == 0 (others give NaN or crash); other layers stay as they are


def resolve_quantize(scheme: str | None, device: torch.device) -> str | None:
    """The scheme a draft on ``device`` runs with (auto -> int8 on a CPU, else None)."""
    if scheme is not None and scheme not in QUANTIZE_SCHEMES:
        raise UserInputError(f"draft.quantize={scheme} is not allowed; use null or one of {', '.join(QUANTIZE_SCHEMES)}")
    if scheme == "auto":
        return "int8" if device.type == "cpu" else None
    if scheme is not None and device.type != "cpu":
        raise UserInputError(f"draft.quantize={scheme} runs on a CPU kernel only; the draft is on {device}")
    return scheme


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight [N, K] -> (int8 [N, K], scales [N] fp32) with weight ~= int8 * scales[:, None] (symmetric)."""
    w = weight.detach().float()
    scales = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # [N]
    return (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales


class Int8WeightLinear(nn.Module):
    """A bias-free nn.Linear with int8 weights; bf16 activations in the kernel, the input's dtype out."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight, scales = int8_per_channel(linear.weight)
        self.register_buffer("weight", weight)  # [N, K] int8
        self.register_buffer("scales", scales.to(torch.bfloat16))  # [N]
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [M, K]
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)  # [M, N] bf16
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def quantizable(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and module.bias is None and module.in_features % KERNEL_K_MULTIPLE == 0


def quantize_linears(model: nn.Module, scheme: str | None) -> nn.Module:
    """A copy of ``model`` whose bias-free nn.Linear layers (the LM head included) hold int8
    weights; ``model`` itself when the scheme resolves to None. Embeddings stay as they are (a step reads one row)."""
    if resolve_quantize(scheme, next(model.parameters()).device) is None:
        return model
    model = copy.deepcopy(model)  # never touch a model shared with the target (a tied head, draft=target)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if quantizable(child):
                setattr(parent, name, Int8WeightLinear(child))
    return model
