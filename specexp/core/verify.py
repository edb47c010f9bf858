"""The speculative sampling rule (Leviathan et al. 2023; Chen et al. 2023), batched.

Notation, fixed for the whole project:
  p  target distribution (after the shared warp), ``target_probs``
  q  draft distribution (after the same warp),    ``draft_probs``
  x_i  the draft token at position i (0-based), drawn from q_i

Rule: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to right. At the first
rejection, at position n, emit a token drawn from norm(max(p_n - q_n, 0)). If all K are
accepted, emit a bonus token drawn from p_K. The emitted sequence is distributed exactly as
sampling from p token by token.

Special cases are the same rule, not new code:
  * greedy: p and q one-hot -> accept iff x_i == argmax p_i, then emit argmax p_n;
  * deterministic draft (one-hot q): accept with probability p_i(x_i), resample from p_n
    with x_n removed;
  * padding: a position with q_i(x_i) == 0 is never accepted, and its residual is p_i
    itself. A draft that proposes fewer than K tokens in a row zeroes q past its last one,
    so that row gets the bonus token from p at its own length.
"""

import torch

from specexp.core.sampling import sample


def speculative_verify(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor,  # [B, K, V]
    target_probs: torch.Tensor,  # [B, K+1, V]
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify K draft tokens per row against the target.

    Returns n_accepted [B] long in 0..K and next_token [B] long: the residual resample at
    the first rejection, or the bonus token from ``target_probs[:, K]`` when all K pass.
    """
    B, K = draft_tokens.shape
    p_x = target_probs[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
    q_x = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
    u = torch.rand(B, K, generator=generator, device=draft_tokens.device)  # [B, K] in [0, 1)
    # u < p/q, written without division; p >= q always passes since u < 1.
    accepted = (q_x > 0) & (u * q_x < p_x)  # [B, K]
    n_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]: accepted prefix length

    # Residual at the first rejected position n. q counts as zero at position K, so rows
    # that accepted all K get the bonus token from p_K through the same line.
    rows = torch.arange(B, device=draft_tokens.device)
    p_n = target_probs[rows, n_accepted]  # [B, V]
    if K == 0:
        q_n = torch.zeros_like(p_n)
    else:
        q_n = draft_probs[rows, n_accepted.clamp_max(K - 1)] * (n_accepted < K)[:, None]  # [B, V]
    residual = (p_n - q_n).clamp_min(0)  # [B, V]
    # p_n == q_n leaves no mass; rejection then had probability 0, so only rounding got us
    # here and p_n is the right distribution.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    next_token = sample(residual, generator)  # [B]
    return n_accepted, next_token
