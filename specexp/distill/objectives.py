"""Divergences between the teacher (target) p and the student (draft) q, per position.

All take logits [N, V] of both models and a temperature, and return [N]. Speculative
decoding accepts a draft token with probability sum_x min(p(x), q(x)) = 1 - TVD(p, q), so
TVD is the quantity acceptance depends on (DistillSpec, Zhou et al. 2023); the KLs and JSD
are smoother surrogates.
"""

import torch
import torch.nn.functional as F

from specexp.errors import UserInputError


def _log_probs(teacher_logits: torch.Tensor, student_logits: torch.Tensor, temperature: float):
    log_p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)  # [N, V]
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1)  # [N, V]
    return log_p, log_q


def forward_kl(teacher_logits, student_logits, temperature: float = 1.0) -> torch.Tensor:
    """KL(p || q) = sum_x p(x) (log p(x) - log q(x)): mass-covering."""
    log_p, log_q = _log_probs(teacher_logits, student_logits, temperature)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def reverse_kl(teacher_logits, student_logits, temperature: float = 1.0) -> torch.Tensor:
    """KL(q || p) = sum_x q(x) (log q(x) - log p(x)): mode-seeking."""
    log_p, log_q = _log_probs(teacher_logits, student_logits, temperature)
    return (log_q.exp() * (log_q - log_p)).sum(-1)


def total_variation(teacher_logits, student_logits, temperature: float = 1.0) -> torch.Tensor:
    """TVD(p, q) = 1/2 sum_x |p(x) - q(x)| = 1 - expected acceptance of one draft token."""
    log_p, log_q = _log_probs(teacher_logits, student_logits, temperature)
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)


def jensen_shannon(teacher_logits, student_logits, temperature: float = 1.0) -> torch.Tensor:
    """JSD(p, q) = 1/2 KL(p || m) + 1/2 KL(q || m), m = (p + q) / 2."""
    log_p, log_q = _log_probs(teacher_logits, student_logits, temperature)
    log_m = torch.logsumexp(torch.stack([log_p, log_q]), dim=0) - torch.log(torch.tensor(2.0))
    return 0.5 * (log_p.exp() * (log_p - log_m)).sum(-1) + 0.5 * (log_q.exp() * (log_q - log_m)).sum(-1)


OBJECTIVES = {"forward_kl": forward_kl, "reverse_kl": reverse_kl, "tvd": total_variation, "jsd": jensen_shannon}


def objective(name: str):
    if name not in OBJECTIVES:
        raise UserInputError(f"objective '{name}' is unknown; allowed: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
