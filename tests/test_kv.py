"""The ragged KV cache: after any sequence of appends and rewinds, logits match a fresh forward."""

import pytest
import torch

from specexp.core.kv import RaggedKV
from specexp.drafts.lean_llama import LeanLlama


@pytest.mark.parametrize("forward", ["hf", "lean"])
def test_rewound_cache_gives_fresh_forward_logits(target, forward):
    """Through HF's forward or the drafts' lean one (tested against HF's on each row alone)."""
    g = torch.Generator().manual_seed(0)
    V = target.vocab_size
    model = target.model if forward == "hf" else LeanLlama(target.model)
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    P = max(map(len, prompts))
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    committed = [list(p) for p in prompts]
    kv = RaggedKV.empty(model, 3, torch.device("cpu"))
    with torch.no_grad():
        kv.forward(model, ids, mask)
        for _step in range(12):
            T = int(torch.randint(1, 5, (1,), generator=g))
            new = torch.randint(2, V, (3, T), generator=g)
            kv.forward(model, new)
            drop = torch.randint(0, T + 1, (3,), generator=g)  # per-row rewinds, like ragged accepts
            kv.drop_last(drop)
            for b in range(3):
                committed[b] += new[b, : T - int(drop[b])].tolist()
            assert kv.n_valid.tolist() == [len(c) for c in committed]
            # The next token's logits through the cache equal a fresh forward of each row alone.
            probe = torch.randint(2, V, (3, 1), generator=g)
            cached = kv.forward(model, probe)[:, -1]
            kv.drop_last(torch.ones(3, dtype=torch.long))
            for b in range(3):
                fresh = target.model(torch.tensor([committed[b] + probe[b].tolist()])).logits[0, -1]
                torch.testing.assert_close(cached[b], fresh, rtol=1e-9, atol=1e-9)
    # Slots no row uses are cropped: the cache never holds more than the longest row + holes.
    assert kv.mask.shape[1] == kv.cache.get_seq_length()


def test_single_row_cache_stays_dense(target):
    kv = RaggedKV.empty(target.model, 1, torch.device("cpu"))
    with torch.no_grad():
        kv.forward(target.model, torch.tensor([[3, 4, 5]]))
        for drop in (2, 0, 3):
            kv.forward(target.model, torch.tensor([[6, 7, 8]]))
            kv.drop_last(torch.tensor([drop]))
    assert kv.mask.shape[1] == int(kv.n_valid) == kv.cache.get_seq_length() == 3 + 1 + 3 + 0
