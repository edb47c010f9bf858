"""The engine's side of a K policy (the policies themselves: specexp/k_policy/): how many tokens a round drafts.

The engine asks a policy for each round's K before the draft proposes (0: the round runs
without the draft, a plain AR step), lets it shorten the proposal after (a draft whose tokens
cost nothing, like prompt lookup, proposes all it has and the policy keeps what pays), and
tells it what was accepted. Any K keeps the output exact: only the speed depends on it.
"""

from typing import Protocol

import numpy as np
import torch

from specexp.core.interface import Context, Proposal, RoundSeen


class KPolicy(Protocol):
    """Works on the host: it reads ``ctx.on_host()`` and what the engine read back of each round, never the device."""

    def begin(self, batch_size: int, k_max: int, max_new_tokens: int) -> None:
        """A new batch of prompts: per-row state starts over; what was learnt across prompts stays."""

    def choose(self, ctx: Context) -> int:
        """K for this round, 0..k_max (0: no draft)."""

    def shorten(self, proposal: Proposal, ctx: Context) -> Proposal:
        """The part of the proposal worth verifying."""

    def observe(self, seen: RoundSeen) -> None:
        """What the round's rule accepted of what was proposed, for the rows that were active."""


def truncate(proposal: Proposal, k: int) -> Proposal:
    """The proposal's first k tokens of every row (of a tree: its first k nodes, still a tree)."""
    host = proposal.n_proposed_host
    return Proposal(tokens=proposal.tokens[:, :k], probs=proposal.probs[:, :k],
                    n_proposed=proposal.n_proposed.clamp(max=k), group=proposal.group,
                    parents=None if proposal.parents is None else proposal.parents[:, :k],
                    reencode_s=proposal.reencode_s,
                    n_proposed_host=None if host is None else np.minimum(host, k), group_host=proposal.group_host)


def on_host(host: np.ndarray | None, device: torch.Tensor) -> np.ndarray:
    """A proposal's count as the draft built it on the host, else read back from the device."""
    return host if host is not None else device.cpu().numpy()
