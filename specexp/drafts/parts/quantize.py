"""Int8 weights for a small-LM draft on a CPU: fewer bytes per draft step, the same exactness.

Verification only needs q to be the distribution the draft sampled from, so a quantized draft
keeps speculative decoding exact; it can only move alpha and c. On a CPU the step of a 2-layer
draft is dominated by streaming its weights, which the target's pass has just evicted from the
caches: int8 weights are a quarter of fp32's bytes.

Weight-only int8 (one scale per output channel) with bf16 activations runs on PyTorch's
``_weight_int8pack_mm`` CPU kernel (the one torchao's int8 weight-only layout dispatches to).
It was chosen over dynamic int8 (activations quantized too, torch.ao's ``quantize_dynamic``, which
loses agreement to the layers' activation outliers) and torchao's eager int8 configs because it
made the distilled draft's step cheaper without moving its agreement with the target
(docs/lab_notes/draft_quantize.md; docs/lab_notes/code_measurements.md: int8 drafts).
"""

import copy

import torch
from torch import nn

from specexp.errors import UserInputError
from specexp.paths import cache_root
from specexp.runtime.int8 import Int8WeightLinear, int8_per_channel, int8_supported  # noqa: F401  (re-exported)
from specexp.runtime.matmul import MatmulPlans, shape_key

QUANTIZE_SCHEMES = ("int8", "auto")  # null = the draft's own weights; auto = measured per layer shape on a CPU


def resolve_quantize(scheme: str | None, device: torch.device) -> str | None:
    """The scheme a draft on ``device`` runs with (auto: measured on a CPU, None elsewhere)."""
    if scheme is not None and scheme not in QUANTIZE_SCHEMES:
        raise UserInputError(f"draft.quantize={scheme} is not allowed; "
                             f"use null or one of {', '.join(QUANTIZE_SCHEMES)}")
    if scheme == "auto":
        return "auto" if device.type == "cpu" else None
    if scheme is not None and device.type != "cpu":
        raise UserInputError(f"draft.quantize={scheme} runs on a CPU kernel only; the draft is on {device}")
    return scheme


def quantize_linears(model: nn.Module, scheme: str | None, rows: tuple[int, ...] = (1,),
                     in_place: bool = False) -> nn.Module:
    """A copy of ``model`` whose bias-free nn.Linear layers (the LM head included) hold int8
    weights; ``model`` itself when the scheme resolves to None. Embeddings stay as they are (a
    step reads one row). ``auto``: only the layer shapes for which this machine's matmul plan
    measured the int8 kernel faster than the best fp32 formulation at ``rows`` (a draft step's).
    ``in_place``: swap the layers in ``model`` itself (a head just loaded for this draft, which
    holds the target's embedding by reference: a copy would copy that too)."""
    scheme = resolve_quantize(scheme, next(model.parameters()).device)
    if scheme is None:
        return model
    chosen = {name: m for name, m in model.named_modules() if int8_supported(m)}
    if scheme == "auto":
        plans = MatmulPlans(cache_root() / "plans", next(model.parameters()).device)
        faster = plans.int8_faster([m.weight for m in chosen.values()], rows)
        chosen = {name: m for name, m in chosen.items() if faster[shape_key(m.weight)]}
    if not chosen:
        return model
    if not in_place:
        # Never swap layers in a model shared with the target (a tied head, draft=target): a new module
        # tree over the same tensors (the int8 layers only read their fp32 weights; nothing writes
        # them), so neither the weights about to be replaced nor the embedding (the target's, for
        # draft=target_prefix: 113 MB for SmolLM2) are copied each job.
        model = copy.deepcopy(model, memo={id(t): t for t in (*model.parameters(), *model.buffers())})
    for name in chosen:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, Int8WeightLinear(getattr(owner, child)))
    return model
