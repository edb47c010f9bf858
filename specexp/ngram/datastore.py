"""A REST-style retrieval datastore (He et al. 2023): token sequences in a suffix array.

The suffix array comes from libdivsufsort (via pydivsufsort), which sorts integer
alphabets directly. A query finds the longest suffix of the context that occurs in the
datastore (binary search per length), then walks the continuations of its occurrences
token by token: q_i is the empirical distribution of the next token among the occurrences
that agree with the tokens drafted so far.
"""

from pathlib import Path

import numpy as np
from pydivsufsort import divsufsort

from specexp.errors import UserInputError
from specexp.ngram.corpus import join_documents
from specexp.ngram.storage import load_npz, save_npz

SEPARATOR = -1  # between documents; sorts before every token, never continues a match


class SuffixDatastore:
    def __init__(self, tokens: np.ndarray, suffix_array: np.ndarray, vocab_size: int, fingerprint: str):
        self.tokens = tokens  # [M] int32, documents separated by SEPARATOR
        self.suffix_array = suffix_array  # [M] int64: suffix start positions in lexicographic order
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint

    @classmethod
    def build(cls, documents: list[list[int]], vocab_size: int, fingerprint: str) -> "SuffixDatastore":
        if not any(documents):
            raise UserInputError("the retrieval corpus is empty; give text or generations with at least one token")
        tokens = join_documents(documents, SEPARATOR).astype(np.int32)
        if tokens.max() >= vocab_size:
            raise UserInputError(f"corpus token ids must lie in 0..{vocab_size - 1}")
        return cls(tokens, divsufsort(tokens).astype(np.int64), vocab_size, fingerprint)

    def _bound(self, pattern: list[int], upper: bool) -> int:
        """First suffix-array index whose suffix's first len(pattern) tokens are >= pattern
        (> pattern when upper)."""
        lo, hi, m = 0, len(self.suffix_array), len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            start = int(self.suffix_array[mid])
            head = self.tokens[start : start + m].tolist()
            if head < pattern or (upper and head == pattern):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def occurrences(self, pattern: list[int]) -> np.ndarray:
        """Start positions of every occurrence of pattern (in suffix-array order)."""
        lo, hi = self._bound(pattern, upper=False), self._bound(pattern, upper=True)
        return self.suffix_array[lo:hi]

    def longest_match(self, context: list[int], max_match: int) -> tuple[int, np.ndarray]:
        """(m, positions): the longest suffix of context (m <= max_match) that occurs, and where.

        If a suffix of length m occurs, so does every shorter one, so lengths are tried
        upwards until one fails.
        """
        best_m, best = 0, self.suffix_array[:0]
        for m in range(1, min(max_match, len(context)) + 1):
            found = self.occurrences(context[len(context) - m :])
            if len(found) == 0:
                break
            best_m, best = m, found
        return best_m, best

    def continuations(self, positions: np.ndarray, m: int, k: int) -> np.ndarray:
        """[n, k] int64: the k tokens after each occurrence, SEPARATOR-padded past a document end."""
        idx = positions[:, None] + m + np.arange(k)[None, :]  # [n, k]
        conts = np.where(idx < len(self.tokens), self.tokens[np.minimum(idx, len(self.tokens) - 1)], SEPARATOR)
        ended = np.cumsum(conts == SEPARATOR, axis=1) > 0  # everything after a document end
        return np.where(ended, SEPARATOR, conts).astype(np.int64)

    def save(self, path: str | Path) -> None:
        save_npz(path, {"kind": "suffix_datastore", "vocab_size": self.vocab_size, "fingerprint": self.fingerprint},
                 {"tokens": self.tokens, "suffix_array": self.suffix_array})

    @classmethod
    def load(cls, path: str | Path) -> "SuffixDatastore":
        meta, arrays = load_npz(path, "suffix_datastore")
        return cls(arrays["tokens"], arrays["suffix_array"], meta["vocab_size"], meta["fingerprint"])
