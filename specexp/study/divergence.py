"""Where a greedy study's two arms part: the first position at which the speculative tokens differ
from the AR baseline's, and how far apart the target's logits of the two tokens are there.

Both arms are the target's greedy decode, so in exact arithmetic they agree: the verify rule keeps
the target's argmax. In finite precision the target's logits depend on the pass that computes them
(a verify pass over K+1 tokens and a 1-token pass run other kernels, which round differently), so
where two tokens' logits lie within rounding of each other either may win. The gap at the first
divergence, in units of the dtype's rounding step at that logit, tells that case (a gap of a step or
two: seen under bf16 on a GPU) from a broken rule (a clear winner lost).
"""

import math
from collections.abc import Callable

import torch

from specexp.core.kv import new_ragged_kv


def first_divergence(ar_tokens: list[int], spec_tokens: list[int]) -> int | None:
    """The first position where both arms emitted a token and the tokens differ (None: none does)."""
    return next((j for j, (a, s) in enumerate(zip(ar_tokens, spec_tokens, strict=False)) if a != s), None)


def rounding_step(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers at ``value``: its unit in the last place there."""
    if value == 0:
        return float(torch.finfo(dtype).tiny)
    return float(torch.finfo(dtype).eps) * 2.0 ** math.floor(math.log2(abs(value)))


@torch.inference_mode()
def divergence(forward: Callable, prompt: list[int], ar_tokens: list[int], spec_tokens: list[int]) -> dict | None:
    """At the first divergence: both tokens, the target's logit gap between them (the AR token's
    minus the speculative one's) from one pass over the prompt and the AR tokens before it, and the
    rounding step of the forward's dtype at those logits. A third pass shape, so the gap's sign may
    go either way: its size is what says whether the two were tied within rounding."""
    position = first_divergence(ar_tokens, spec_tokens)
    if position is None:
        return None
    ids = torch.tensor([prompt + ar_tokens[:position]], device=forward.device)  # [1, P + position]
    kv = new_ragged_kv(forward, 1, ids.device, capacity=ids.shape[1])
    logits = kv.forward(forward, ids)[0, -1].float()  # [V]
    ar_token, spec_token = ar_tokens[position], spec_tokens[position]
    scale = max(abs(float(logits[ar_token])), abs(float(logits[spec_token])))
    return {"position": position, "ar_token": ar_token, "spec_token": spec_token,
            "logit_gap": float(logits[ar_token] - logits[spec_token]),
            "rounding_step": rounding_step(scale, forward.dtype)}


def steps_apart(divergence: dict) -> float:
    """A divergence's logit gap in rounding steps of the dtype there."""
    return abs(divergence["logit_gap"]) / divergence["rounding_step"]


def divergence_line(divergences: list[dict], n_prompts: int, dtype: torch.dtype) -> str:
    """One line for the console: how many prompts differ and their gaps in rounding steps."""
    steps = ", ".join(f"{steps_apart(d):.1f}" for d in divergences)
    return (f"[greedy] {len(divergences)} of {n_prompts} prompts differ from the AR arm; at the first divergence the "
            f"two tokens' logits differ by {steps} rounding steps of {str(dtype).removeprefix('torch.')} at that scale "
            f"(a near-tie that two pass shapes round apart shows as a few steps; a broken rule as a clear gap)")
