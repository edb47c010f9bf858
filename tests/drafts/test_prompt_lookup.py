"""Prompt lookup: the incremental index equals a brute-force scan; proposals are one-hot."""

import json
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.core.interface import Context
from specexp.core.sampling import SamplingConfig
from specexp.drafts.parts.base import trie
from specexp.drafts.parts.context_index import ContextIndex
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.errors import UserInputError
from tests.commands import run_specexp


def brute_force(seq: list[int], max_n: int, min_n: int, k: int, choice: str, max_candidates: int = 64):
    """Scan every earlier window, longest n first."""
    L = len(seq)
    for n in range(max_n, min_n - 1, -1):
        if n > L - 1:
            continue
        starts = [s for s in range(L - n) if seq[s : s + n] == seq[L - n :]]  # windows with a continuation
        if not starts:
            continue
        if choice in ("recent", "first"):
            s = starts[-1] if choice == "recent" else starts[0]
            return n, seq[s + n : s + n + k]
        recent_first = [tuple(seq[s + n : s + n + k]) for s in reversed(starts[-max_candidates:])]
        counts = Counter(recent_first)
        return n, list(next(c for c in recent_first if counts[c] == max(counts.values())))
    return 0, []


@settings(max_examples=300, deadline=None)
@given(
    seq=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    chunks=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    max_n=st.integers(1, 5),
    min_n=st.integers(1, 5),
    k=st.integers(1, 8),
    choice=st.sampled_from(["recent", "first", "frequent"]),
)
def test_incremental_index_matches_brute_force(seq, chunks, max_n, min_n, k, choice):
    """Fed in random chunks (like rounds committing 1..K+1 tokens), every lookup equals the scan."""
    min_n = min(min_n, max_n)
    index = ContextIndex(max_n, min_n, max_candidates=3)
    pos = 0
    for size in chunks * 3:
        if pos >= len(seq):
            break
        index.extend(seq[pos : pos + size])
        pos += size
        assert index.lookup(k, choice) == brute_force(seq[:pos], max_n, min_n, k, choice, max_candidates=3)


def test_frequent_choice_prefers_the_common_continuation():
    index = ContextIndex(max_n=1, min_n=1)
    index.extend([7, 1, 7, 1, 7, 2, 7])
    assert index.lookup(1, "recent") == (1, [2])
    assert index.lookup(1, "first") == (1, [1])
    assert index.lookup(1, "frequent") == (1, [1])


def test_proposal_is_one_hot_and_padded(target):
    drafter = PromptLookupDrafter(target, k=4, max_n=2, min_n=1, max_tokens_after_match=[])
    tokens = torch.tensor([[0, 7, 8, 9, 7, 8, 0], [4, 5, 6, 10, 11, 0, 0]])
    ctx = Context(tokens=tokens, start=torch.tensor([1, 0]), lengths=torch.tensor([6, 5]),
                  done=torch.tensor([False, False]))
    drafter.reset(ctx)
    proposal = drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(), None)
    # row 0 (7 8 9 7 8): "7 8" seen before -> "9 7 8", the continuation runs out at 3; row 1: no repeat
    assert proposal.n_proposed.tolist() == [3, 0]
    assert proposal.tokens.shape == (2, 3) and proposal.tokens[0].tolist() == [9, 7, 8]
    assert torch.equal(proposal.probs[0].argmax(-1), torch.tensor([9, 7, 8]))
    assert proposal.probs[0].sum().item() == 3.0 and proposal.probs[1].sum().item() == 0.0
    # Committing more tokens extends each row's index incrementally.
    ctx.tokens[1, 5:7] = torch.tensor([4, 5])
    ctx.lengths = torch.tensor([6, 7])
    drafter.update(ctx, proposal, torch.tensor([0, 0]))
    assert drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(), None).tokens[1].tolist() == [6, 10, 11, 4]


def test_short_matches_propose_at_most_their_cap(target):
    # row 0 ends in "7 8" (a 2-gram match, continuation 9 7 8), row 1 in "6" (a 1-gram match only)
    tokens = torch.tensor([[7, 8, 9, 7, 8], [6, 1, 2, 3, 6]])
    ctx = Context(tokens=tokens, start=torch.tensor([0, 0]), lengths=torch.tensor([5, 5]),
                  done=torch.tensor([False, False]))
    for caps, expected in [([], [[9, 7, 8], [1, 2, 3, 6]]), ([1, 2], [[9, 7], [1]]), ([0], [[9, 7, 8], []])]:
        drafter = PromptLookupDrafter(target, k=4, max_n=3, max_tokens_after_match=caps)
        drafter.reset(ctx)
        proposal = drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(), None)
        assert [row[:n].tolist() for row, n in zip(proposal.tokens, proposal.n_proposed, strict=True)] == expected


@pytest.mark.parametrize("caps", [[1, 2, 3, 4], [-1]])
def test_bad_caps_are_refused(target, caps):
    with pytest.raises(UserInputError, match="max_tokens_after_match"):
        PromptLookupDrafter(target, k=4, max_n=3, max_tokens_after_match=caps)


def brute_force_continuations(seq: list[int], max_n: int, min_n: int, k: int,
                              branches: int) -> list[tuple[int, list[int]]]:
    """choice="first": every earlier window's continuation, longest n first, earliest first, distinct."""
    found: list[tuple[int, list[int]]] = []
    L = len(seq)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        for s in range(L - n):
            if seq[s : s + n] == seq[L - n :] and seq[s + n : s + n + k] not in [c for _, c in found]:
                found.append((n, seq[s + n : s + n + k]))
    return found[:branches]


@settings(max_examples=200, deadline=None)
@given(seq=st.lists(st.integers(0, 3), min_size=1, max_size=40), max_n=st.integers(1, 4), k=st.integers(1, 6),
       branches=st.integers(1, 5))
def test_continuations_list_every_different_one_longest_match_first(seq, max_n, k, branches):
    index = ContextIndex(max_n=max_n, min_n=1)
    index.extend(seq)
    assert index.continuations(k, "first", branches) == brute_force_continuations(seq, max_n, 1, k, branches)


def test_trie_shares_prefixes_follows_the_first_and_keeps_the_budget():
    assert trie([[1, 2, 3], [1, 4], [5]], 10) == ([1, 2, 3, 4, 5], [-1, 0, 1, 0, -1])
    assert trie([[1, 2, 3], [1, 4], [5]], 4) == ([1, 2, 3, 4], [-1, 0, 1, 0])
    assert trie([[1, 2, 3], [1, 2]], 10) == ([1, 2, 3], [-1, 0, 1])  # a prefix of another adds nothing


def test_tree_proposal_branches_where_earlier_continuations_differ(target):
    # "7 8" occurred twice before, followed by 9 1 and 9 2; "8" also by 3
    tokens = torch.tensor([[7, 8, 9, 1, 7, 8, 9, 2, 8, 3, 7, 8]])
    ctx = Context(tokens=tokens, start=torch.tensor([0]), lengths=torch.tensor([12]), done=torch.tensor([False]))
    drafter = PromptLookupDrafter(target, k=5, max_n=2, min_n=1, max_tokens_after_match=[], branches=3)
    drafter.reset(ctx)
    proposal = drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(), None)
    # Continuations of up to 5 - 3 + 1 = 3 tokens (room for the other branches): (2, 9 1 7) and
    # (2, 9 2 8) share their 9; (1, 3 7 8) finds no node left.
    assert proposal.tokens[0].tolist() == [9, 1, 7, 2, 8] and proposal.parents[0].tolist() == [-1, 0, 1, 0, 3]
    drafter = PromptLookupDrafter(target, k=8, max_n=2, min_n=1, max_tokens_after_match=[], branches=3)
    drafter.reset(ctx)
    proposal = drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(), None)
    assert proposal.tokens[0].tolist() == [9, 1, 7, 8, 9, 2, 2, 8]  # 6 deep, then the second branch
    assert proposal.parents[0].tolist() == [-1, 0, 1, 2, 3, 4, 0, 6]
    assert torch.equal(proposal.probs[0].argmax(-1), proposal.tokens[0]) and proposal.probs[0].sum().item() == 8.0
    assert proposal.group.tolist() == [2]


@pytest.mark.parametrize(("k", "branches", "message"), [(4, 0, "draft.branches=0 is not allowed")])
def test_bad_branches_are_refused(target, k, branches, message):
    with pytest.raises(UserInputError, match=message):
        PromptLookupDrafter(target, k=k, branches=branches)


@pytest.mark.default_target
def test_a_tree_study_runs_from_the_cli_and_decodes_as_the_target(tmp_path):
    """`python -m specexp draft=prompt_lookup draft.k=8 draft.branches=3` on the embedded default:
    every answer identical to the target's own, some tree nodes accepted."""
    out = run_specexp("size=smoke", "draft=prompt_lookup", "draft.k=8", "draft.branches=3", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["greedy_match"] == 1.0 and summary["tau"] > 1.0
