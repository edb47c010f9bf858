"""The Kneser-Ney n-gram LM against a dictionary-based reference implementation."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.errors import UserInputError
from specexp.ngram.kneser_ney import KneserNeyLM


def reference_distribution(stream: list[int], order: int, V: int, context: list[int]) -> list[float]:
    """Interpolated Kneser-Ney written the slow, obvious way."""
    def grams(n):
        return [tuple(stream[i : i + n]) for i in range(len(stream) - n + 1)]

    tables = {order: Counter(grams(order))}
    for n in range(1, order):
        tables[n] = Counter(g[1:] for g in set(grams(n + 1)))

    def discount(table):
        n1 = sum(1 for c in table.values() if c == 1)
        n2 = sum(1 for c in table.values() if c == 2)
        return 0.5 if n1 == 0 or n2 == 0 else min(max(n1 / (n1 + 2 * n2), 0.05), 0.95)

    p = [1.0 / V] * V
    for n in range(1, order + 1):
        if n - 1 > len(context):
            break
        h = tuple(context[len(context) - (n - 1) :])
        after = {g[-1]: c for g, c in tables[n].items() if g[:-1] == h}
        if not after:
            continue
        total, d = sum(after.values()), discount(tables[n])
        p = [x * d * len(after) / total for x in p]
        for w, c in after.items():
            p[w] += (c - d) / total
    return p


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(st.integers(0, 5), min_size=1, max_size=80),
    order=st.integers(1, 5),
    context=st.lists(st.integers(0, 5), max_size=6),
)
def test_matches_reference_and_sums_to_one(stream, order, context):
    lm = KneserNeyLM.build(np.array(stream), order, vocab_size=8, fingerprint="test")
    p = lm.distribution(context)
    np.testing.assert_allclose(p, reference_distribution(stream, order, 8, context), rtol=1e-12, atol=1e-15)
    assert abs(p.sum() - 1.0) < 1e-12 and (p > 0).all()


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 50, 5000)
    lm = KneserNeyLM.build(stream, 4, vocab_size=64, fingerprint="fp")
    lm.save(tmp_path / "lm.npz")
    loaded = KneserNeyLM.load(tmp_path / "lm.npz")
    assert loaded.order == 4 and loaded.fingerprint == "fp" and loaded.vocab_size == 64
    for context in ([], [3], [1, 2, 3], stream[-10:].tolist()):
        np.testing.assert_array_equal(lm.distribution(context), loaded.distribution(context))


def test_bad_inputs():
    with pytest.raises(UserInputError, match="empty"):
        KneserNeyLM.build(np.array([], dtype=np.int64), 3, 8, "fp")
    with pytest.raises(UserInputError, match="order 9 is not allowed; it must be in 1..8"):
        KneserNeyLM.build(np.array([1, 2]), 9, 8, "fp")
    with pytest.raises(UserInputError, match="order 0 is not allowed; it must be in 1..8"):
        KneserNeyLM.build(np.array([1, 2]), 0, 8, "fp")
    with pytest.raises(UserInputError, match="token ids must lie in 0..7"):
        KneserNeyLM.build(np.array([1, 9]), 2, 8, "fp")
