"""Weight-only int8 linears on a CPU: one scale per output channel, bf16 activations, PyTorch's
``_weight_int8pack_mm`` kernel (the one torchao's int8 weight-only layout dispatches to). A
runtime kernel: drafts choose it (`drafts/parts/quantize.py`), matmul plans time it against fp32.
"""

import torch
from torch import nn

from specexp.models.reuse import derived_from_kept

KERNEL_K_MULTIPLE = 16  # the kernel needs in_features % 16 == 0 (others give NaN or crash)


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight [N, K] -> (int8 [N, K], scales [N] fp32) with weight ~= int8 * scales[:, None] (symmetric)."""
    w = weight.detach().float()
    scales = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # [N]
    return (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales


class Int8WeightLinear(nn.Module):
    """A bias-free nn.Linear with int8 weights; bf16 activations in the kernel, the input's dtype out."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        # a kept load's weights are quantized once per process (a sweep's next job reads the same)
        weight, scales = derived_from_kept("int8", [linear.weight], lambda: int8_per_channel(linear.weight))
        self.register_buffer("weight", weight)  # [N, K] int8
        self.register_buffer("scales", scales.to(torch.bfloat16))  # [N]
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @classmethod
    @torch.no_grad()
    def concatenated(cls, layers: list["Int8WeightLinear"]) -> "Int8WeightLinear":
        """One layer computing ``cat([l(x) for l in layers], -1)`` (per-channel scales: exact). Each
        original's buffers become views of the fused ones: nothing is stored twice."""
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.register_buffer("weight", torch.cat([layer.weight for layer in layers]))
        fused.register_buffer("scales", torch.cat([layer.scales for layer in layers]))
        fused.in_features, fused.out_features = layers[0].in_features, sum(layer.out_features for layer in layers)
        start = 0
        for layer in layers:
            stop = start + layer.out_features
            layer.weight, layer.scales = fused.weight[start:stop], fused.scales[start:stop]
            start = stop
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [M, K]
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)  # [M, N] bf16
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def int8_supported(module: nn.Module) -> bool:
    """A bias-free nn.Linear the kernel can take."""
    return isinstance(module, nn.Linear) and module.bias is None and module.in_features % KERNEL_K_MULTIPLE == 0
