"""Prompt lookup: the vectorised matcher equals a brute-force scan."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.core.sampling import SamplingConfig
from specexp.drafts.base import Context
from specexp.drafts.prompt_lookup import PromptLookupDrafter, lookup_continuation


def brute_force(seq: list[int], max_n: int, min_n: int, k: int) -> list[int]:
    L = len(seq)
    for n in range(max_n, min_n - 1, -1):
        if n > L - 1:
            continue
        for start in range(L - n - 1, -1, -1):  # most recent earlier occurrence first
            if seq[start : start + n] == seq[L - n :]:
                return seq[start + n : start + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(
    seq=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    max_n=st.integers(1, 5),
    min_n=st.integers(1, 5),
    k=st.integers(1, 8),
)
def test_lookup_matches_brute_force(seq, max_n, min_n, k):
    min_n = min(min_n, max_n)
    got = lookup_continuation(np.array(seq), max_n, min_n, k).tolist()
    assert got == brute_force(seq, max_n, min_n, k)


def test_proposal_is_one_hot_and_padded(target):
    drafter = PromptLookupDrafter(target, k=4, max_n=2, min_n=1)
    tokens = torch.tensor([[0, 7, 8, 9, 7, 8, 0], [4, 5, 6, 10, 11, 0, 0]])
    ctx = Context(tokens=tokens, start=torch.tensor([1, 0]), lengths=torch.tensor([6, 5]),
                  done=torch.tensor([False, False]))
    proposal = drafter.propose(ctx, SamplingConfig(), None)
    # row 0 (7 8 9 7 8): "7 8" seen before -> "9 7 8", the continuation runs out at 3; row 1: no repeat
    assert proposal.n_proposed.tolist() == [3, 0]
    assert proposal.tokens.shape == (2, 3) and proposal.tokens[0].tolist() == [9, 7, 8]
    assert torch.equal(proposal.probs[0].argmax(-1), torch.tensor([9, 7, 8]))
    assert proposal.probs[0].sum().item() == 3.0 and proposal.probs[1].sum().item() == 0.0
