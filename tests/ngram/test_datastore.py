"""The suffix-array datastore against brute force."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.ngram.datastore import SEPARATOR, SuffixDatastore


def occurrences_brute_force(stream: list[int], pattern: list[int]) -> list[int]:
    m = len(pattern)
    return [i for i in range(len(stream) - m + 1) if stream[i : i + m] == pattern]


docs_strategy = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=25), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(docs=docs_strategy, context=st.lists(st.integers(0, 3), min_size=1, max_size=10), k=st.integers(1, 5))
def test_longest_match_and_continuations_match_brute_force(docs, context, k):
    if not any(docs):
        return
    store = SuffixDatastore.build(docs, vocab_size=4, fingerprint="t")
    stream = store.tokens.tolist()
    m, positions = store.longest_match(context, max_match=6)
    # The longest suffix (<= 6) that occurs anywhere, and exactly its occurrences.
    expected_m = max([n for n in range(1, min(6, len(context)) + 1)
                      if occurrences_brute_force(stream, context[len(context) - n :])], default=0)
    assert m == expected_m
    if m:
        assert sorted(positions.tolist()) == occurrences_brute_force(stream, context[len(context) - m :])
        conts = store.continuations(positions, m, k)
        for pos, cont in zip(positions.tolist(), conts.tolist(), strict=True):
            expected = []
            for t in stream[pos + m : pos + m + k]:
                if t == SEPARATOR:
                    break
                expected.append(t)
            assert cont == expected + [SEPARATOR] * (k - len(expected))


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 30, 200).tolist() for _ in range(5)]
    store = SuffixDatastore.build(docs, 32, "fp")
    store.save(tmp_path / "s.npz")
    loaded = SuffixDatastore.load(tmp_path / "s.npz")
    assert loaded.fingerprint == "fp" and np.array_equal(loaded.suffix_array, store.suffix_array)
    assert loaded.longest_match(docs[2][50:60], 8)[0] == 8
