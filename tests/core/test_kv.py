"""The ragged KV caches: after any sequence of appends and rewinds, logits match a fresh forward."""

import pytest
import torch

from specexp.core.kv import RaggedKV, StaticRaggedKV, new_ragged_kv, require_cache_keyword
from specexp.runtime.decoder import lean_decoder
from tests.conftest import tiny_gemma3

# (forward, cache): transformers' forward on its DynamicCache (runtime=hf), the lean decoder on the
# same, and the lean decoder on the static cache (runtime=lean), started small so it must grow.
SETUPS = ["hf-dynamic", "lean-dynamic", "lean-static"]


@pytest.fixture(params=["llama", "gemma3-window4"])
def any_target(request, target):
    """The tiny Llama, and a tiny Gemma3 whose sliding layers see 4 positions: the rounds below reach
    ~30 tokens with holes left by ragged rows, so a window taken over slots instead of positions fails."""
    return target if request.param == "llama" else tiny_gemma3(0)


def make(target, setup: str, batch_size: int):
    model = target.model if setup.startswith("hf") else lean_decoder(target.model)
    if setup.endswith("static"):
        return model, StaticRaggedKV.for_model(model, batch_size, capacity=4, device=torch.device("cpu"))
    return model, RaggedKV.empty(target.model, batch_size, torch.device("cpu"))


PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]


def prefilled(target, setup: str):
    """(forward, cache, committed tokens per row) after a prompt pass over 3 left-padded prompts."""
    model, kv = make(target, setup, len(PROMPTS))
    P = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (P - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in PROMPTS])
    with torch.no_grad():
        kv.forward(model, ids, mask)
    return model, kv, [list(p) for p in PROMPTS]


def assert_next_token_is_fresh(target, model, kv, committed: list[list[int]], g: torch.Generator) -> None:
    """A random next token's logits through the cache equal a fresh forward of each row alone."""
    probe = torch.randint(2, target.vocab_size, (len(committed), 1), generator=g)
    cached = kv.forward(model, probe)[:, -1]
    kv.drop_last(torch.ones(len(committed), dtype=torch.long))
    for b, tokens in enumerate(committed):
        fresh = target.model(torch.tensor([tokens + probe[b].tolist()])).logits[0, -1]
        torch.testing.assert_close(cached[b], fresh, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("setup", SETUPS)
def test_rewound_cache_gives_fresh_forward_logits(any_target, setup):
    """B = 3 left-padded rows, rounds of 1..9 tokens (K = 0..8) with per-row rewinds, like ragged
    accepts; each probe's logits equal HF's forward of that row alone, with no cache."""
    target = any_target
    g = torch.Generator().manual_seed(0)
    V = target.vocab_size
    model, kv, committed = prefilled(target, setup)
    with torch.no_grad():
        for _step in range(12):
            T = int(torch.randint(1, 10, (1,), generator=g))
            new = torch.randint(2, V, (3, T), generator=g)
            kv.forward(model, new)
            drop = torch.randint(0, T + 1, (3,), generator=g)  # per-row rewinds, like ragged accepts
            kv.drop_last(drop)
            for b in range(3):
                committed[b] += new[b, : T - int(drop[b])].tolist()
            assert kv.n_valid.tolist() == [len(c) for c in committed]
            assert_next_token_is_fresh(target, model, kv, committed, g)
    # Slots no row uses are given back: the cache never holds more than the longest row + holes.
    held = kv.cache.get_seq_length() if isinstance(kv, RaggedKV) else max(kv.layer_length)
    assert kv.mask.shape[1] == held
    if isinstance(kv, StaticRaggedKV):
        assert kv.capacity > 4  # it grew


@pytest.mark.parametrize("setup", SETUPS)
def test_single_row_cache_stays_dense(target, setup):
    model, kv = make(target, setup, 1)
    with torch.no_grad():
        kv.forward(model, torch.tensor([[3, 4, 5]]))
        for drop in (2, 0, 3):
            kv.forward(model, torch.tensor([[6, 7, 8]]))
            kv.drop_last(torch.tensor([drop]))
    assert kv.mask.shape[1] == int(kv.n_valid) == 3 + 1 + 3 + 0


def test_static_rewind_moves_an_index_and_copies_nothing(target):
    model = lean_decoder(target.model)
    kv = new_ragged_kv(model, 2, torch.device("cpu"), capacity=32)
    assert isinstance(kv, StaticRaggedKV)
    with torch.no_grad():
        kv.forward(model, torch.tensor([[3, 4, 5], [6, 7, 8]]))
        keys, values = kv.keys.data_ptr(), kv.values.data_ptr()
        kv.forward(model, torch.tensor([[9, 10, 11, 12], [13, 14, 15, 16]]))
        kv.drop_last(torch.tensor([4, 1]))  # row 0 keeps none of the 4, row 1 keeps 3
    assert (kv.keys.data_ptr(), kv.values.data_ptr()) == (keys, values)  # written in place, never copied
    assert kv.length == 6 and kv.layer_length == [6, 6]
    assert kv.mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]
    assert kv.n_valid.tolist() == [3, 6]


def test_transformers_models_get_a_dynamic_cache(target):
    assert isinstance(new_ragged_kv(target.model, 1, torch.device("cpu"), capacity=8), RaggedKV)


def random_tree(n: int, batch_size: int, g: torch.Generator) -> torch.Tensor:
    """Parents [B, n]: node i under the root or any earlier node, drawn per row."""
    parents = torch.zeros(batch_size, n, dtype=torch.long)
    for i in range(n):
        parents[:, i] = torch.randint(-1, i, (batch_size,), generator=g) if i else -1
    return parents


def root_path(parents: list[int], node: int) -> list[int]:
    """Node indices from the root's child down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("setup", SETUPS)
def test_tree_pass_gives_each_nodes_path_logits_and_keeps_the_accepted_path(any_target, setup):
    """Rounds of token trees (random shapes per row, after ragged rounds left holes): each node's
    logits equal a fresh forward of its row's committed tokens, the tip and the node's path; after
    keep_path the cache continues exactly as if only the accepted path had been appended."""
    target = any_target
    g = torch.Generator().manual_seed(1)
    V = target.vocab_size
    model, kv, committed = prefilled(target, setup)
    with torch.no_grad():
        chain = torch.randint(2, V, (3, 4), generator=g)  # a chain round with ragged accepts first: holes
        kv.forward(model, chain)
        drop = torch.tensor([3, 0, 2])
        kv.drop_last(drop)
        for b in range(3):
            committed[b] += chain[b, : 4 - int(drop[b])].tolist()
        for _round in range(4):
            N = int(torch.randint(1, 9, (1,), generator=g))
            parents = random_tree(N, 3, g)
            tokens = torch.randint(2, V, (3, N + 1), generator=g)  # the tip, then the nodes
            logits = kv.forward(model, tokens, logits_to_keep=N + 1, parents=parents)  # [3, N+1, V]
            for b in range(3):
                for node in range(-1, N):
                    path = root_path(parents[b].tolist(), node)
                    fresh = target.model(torch.tensor([committed[b] + [int(tokens[b, 0])]
                                                       + [int(tokens[b, i + 1]) for i in path]])).logits[0, -1]
                    torch.testing.assert_close(logits[b, node + 1], fresh, rtol=1e-9, atol=1e-9)
            # accept, per row, the path down to a random node (or none)
            chosen = [int(torch.randint(-1, N, (1,), generator=g)) for _ in range(3)]
            paths = [root_path(parents[b].tolist(), chosen[b]) for b in range(3)]
            D = max(map(len, paths))
            path = torch.tensor([p + [-1] * (D - len(p)) for p in paths], dtype=torch.long).reshape(3, D)
            n_accepted = torch.tensor([len(p) for p in paths])
            kv.keep_path(path, n_accepted, N)
            for b in range(3):
                committed[b] += [int(tokens[b, 0])] + [int(tokens[b, i + 1]) for i in paths[b]]
            assert kv.n_valid.tolist() == [len(c) for c in committed]
            assert_next_token_is_fresh(target, model, kv, committed, g)


@pytest.mark.parametrize("setup", SETUPS)
def test_a_tree_grown_a_level_per_call_sees_its_ancestors_and_keeps_the_accepted_path(target, setup):
    """A draft's own tree (forward_nodes): nodes appended in several calls, each seeing the committed
    tokens and its ancestors among the nodes appended before, give a fresh forward's logits of their
    paths; keep_path then leaves the cache as if only the accepted path had been appended."""
    g = torch.Generator().manual_seed(2)
    V = target.vocab_size
    model, kv, committed = prefilled(target, setup)
    with torch.no_grad():
        for _round in range(3):
            tip = torch.randint(2, V, (3, 1), generator=g)
            kv.forward(model, tip)
            for b in range(3):
                committed[b].append(int(tip[b]))
            tip_position = kv.n_valid[:, None] - 1
            parents = torch.zeros(3, 0, dtype=torch.long)
            tokens = torch.zeros(3, 0, dtype=torch.long)
            for _level in range(3):
                n, e = parents.shape[1], int(torch.randint(1, 4, (1,), generator=g))
                new_parents = torch.randint(-1, n, (3, e), generator=g) if n else torch.full((3, e), -1)
                parents, tokens = torch.cat([parents, new_parents], 1), torch.cat(
                    [tokens, torch.randint(2, V, (3, e), generator=g)], 1)
                paths = [[root_path(parents[b].tolist(), i) for i in range(n + e)] for b in range(3)]
                seen = torch.tensor([[[j in paths[b][i] for j in range(n + e)] for i in range(n, n + e)]
                                     for b in range(3)])
                positions = tip_position + torch.tensor([[len(paths[b][i]) for i in range(n, n + e)] for b in range(3)])
                logits = kv.forward_nodes(model, tokens[:, n:], positions, seen, logits_to_keep=e)  # [3, e, V]
                for b in range(3):
                    for i in range(n, n + e):
                        fresh = target.model(
                            torch.tensor([committed[b] + tokens[b, paths[b][i]].tolist()])).logits[0, -1]
                        torch.testing.assert_close(logits[b, i - n], fresh, rtol=1e-9, atol=1e-9)
            N = parents.shape[1]
            accepted = [root_path(parents[b].tolist(), int(torch.randint(-1, N, (1,), generator=g))) for b in range(3)]
            D = max(map(len, accepted))
            path = torch.tensor([p + [-1] * (D - len(p)) for p in accepted], dtype=torch.long).reshape(3, D)
            kv.keep_path(path, torch.tensor([len(p) for p in accepted]), N)
            for b in range(3):
                committed[b] += tokens[b, accepted[b]].tolist()
            assert kv.n_valid.tolist() == [len(c) for c in committed]
            assert_next_token_is_fresh(target, model, kv, committed, g)


def test_a_transformers_that_ignores_the_cache_keyword_is_refused():
    """transformers 5.17 drops ``cache=`` into **kwargs: every pass would run without its past (seen
    on a CUDA image with 5.17: greedy output differed from the target alone), so importing refuses it."""
    with pytest.raises(ImportError, match=r"transformers >= 5\.24 \(found 5\.17\.0\)"):
        require_cache_keyword("5.17.0")
    for version in ("5.24.0", "5.25.0", "5.30.0.dev0"):
        require_cache_keyword(version)
