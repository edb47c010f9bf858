"""Logits -> probabilities, and sampling from them.

One warp serves the target and every draft, so p and q are always comparable: the
speculative rule is exact for the *warped* target distribution, whatever the warp.
"""

from dataclasses import dataclass

import torch

from specexp.errors import UserInputError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy: the warp returns one-hot argmax distributions
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1.0 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise UserInputError(f"sampling.temperature={self.temperature} is negative; allowed: 0 (greedy) or > 0")
        if self.top_k < 0:
            raise UserInputError(f"sampling.top_k={self.top_k} is negative; allowed: 0 (off) or >= 1")
        if not 0.0 < self.top_p <= 1.0:
            raise UserInputError(f"sampling.top_p={self.top_p} is outside (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Warp logits [..., V] into probabilities [..., V] (float32): temperature, top-k, top-p."""
    logits = logits.float()
    if cfg.greedy:
        # One-hot argmax: with one-hot p and q the speculative rule *is* the greedy rule.
        # (scatter into float zeros: F.one_hot would build an int64 tensor first, 3x the bytes)
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass strictly before it already reaches top_p (the top-1 always stays).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def draw(logits: torch.Tensor, cfg: SamplingConfig,
         generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Warp logits [..., V] and draw a token from the warp: (token [...], its distribution [..., V]).
    Greedy: the argmax and its one-hot, what sampling the one-hot gives, without the draw."""
    if cfg.greedy:
        token = logits.argmax(-1)
        return token, torch.zeros(logits.shape, device=logits.device).scatter_(-1, token[..., None], 1.0)
    q = logits_to_probs(logits, cfg)
    return sample(q, generator), q


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from (possibly unnormalised) probs [..., V] -> [...] long.

    Inverse CDF: the first index whose cumulative mass exceeds u * total, u ~ U[0, 1).
    A zero-probability token can never be drawn, a one-hot row always gives its hot token,
    and nothing syncs with the host. The cumulative sum is float64 so that u * total stays
    strictly below the total. It is written this way rather than with torch.multinomial or an
    exponential race because it is much faster on the CPU (docs/lab_notes/code_measurements.md:
    sampling a token).
    """
    cdf = probs.double().cumsum(-1)  # [..., V]
    # float32 u <= 1 - 2^-24, so in float64 u * total < total exactly: an index always exists.
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device).double()
    return torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
