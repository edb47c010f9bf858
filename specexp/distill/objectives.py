"""Divergences between the teacher (target) p and the student (draft) q, per position.

Each takes log-probabilities [N, C] of both over the same C categories and returns [N].
Speculative decoding accepts a draft token with probability sum_x min(p(x), q(x)) =
1 - TVD(p, q), so TVD is the quantity acceptance depends on (DistillSpec, Zhou et al. 2023);
the KLs and JSD are smoother surrogates. The categories are the student's vocabulary, or a
coarsening of it when the teacher is cached as its top-k log-probs (see `coarsen`): by the
data-processing inequality every divergence here is then a lower bound of the full one.
"""

import torch
import torch.nn.functional as F

from specexp.errors import UserInputError


def warped_log_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) in float32: [N, C]."""
    return F.log_softmax(logits.float() / temperature, dim=-1)


def forward_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_x p(x) (log p(x) - log q(x)): mass-covering."""
    return torch.xlogy(log_p.exp(), log_p.exp()).sum(-1) - (log_p.exp() * log_q).sum(-1)


def reverse_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(q || p) = sum_x q(x) (log q(x) - log p(x)): mode-seeking."""
    return forward_kl(log_q, log_p)


def total_variation(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """TVD(p, q) = 1/2 sum_x |p(x) - q(x)| = 1 - expected acceptance of one draft token."""
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)


def jensen_shannon(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """JSD(p, q) = 1/2 KL(p || m) + 1/2 KL(q || m), m = (p + q) / 2."""
    log_m = torch.logaddexp(log_p, log_q) - torch.log(torch.tensor(2.0))
    return 0.5 * forward_kl(log_p, log_m) + 0.5 * forward_kl(log_q, log_m)


def top_k_targets(log_p: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher as its k most likely categories: (ids [N, k], log-probs [N, k])."""
    values, ids = log_p.topk(min(k, log_p.shape[-1]), dim=-1)
    return ids, values


def with_rest(log_probs: torch.Tensor) -> torch.Tensor:
    """[N, k] log-probs of k categories -> [N, k+1]: the k, then log P(everything else)."""
    rest = torch.log1p(-log_probs.exp().sum(-1).clamp(max=1 - 1e-6))  # [N]
    return torch.cat([log_probs, rest[:, None]], dim=-1)


def coarsen(log_q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """A full distribution [N, C] on the partition {ids[n, 0], ..., ids[n, k-1], rest}: [N, k+1]."""
    return with_rest(log_q.gather(-1, ids))


OBJECTIVES = {"forward_kl": forward_kl, "reverse_kl": reverse_kl, "tvd": total_variation, "jsd": jensen_shannon}


def objective(name: str):
    if name not in OBJECTIVES:
        raise UserInputError(f"objective '{name}' is unknown; allowed: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
