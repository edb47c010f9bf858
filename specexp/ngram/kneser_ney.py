"""An interpolated Kneser-Ney n-gram LM over token ids, kept in sorted numpy arrays.

For order n, with h the last n-1 tokens and D_n a per-order discount:

  P_n(w | h) = max(c_n(h, w) - D_n, 0) / c_n(h) + D_n * T_n(h) / c_n(h) * P_{n-1}(w | h')

where c_N are raw counts at the highest order N, c_n (n < N) are continuation counts
(the number of distinct tokens seen before the n-gram h w), c_n(h) = sum_w c_n(h, w),
T_n(h) the number of distinct w after h, h' drops the oldest token, and P_0 is uniform
over the vocabulary, so every token keeps probability > 0 and each distribution sums to 1.
A context never seen at order n leaves P_{n-1} unchanged. D_n = n1 / (n1 + 2 n2) from the
count-of-counts (Chen & Goodman 1998), clipped to [0.05, 0.95].

n-grams are keyed by a 64-bit polynomial hash of their tokens. A collision could only blur
the draft's distribution; it never touches exactness, which the verifier guarantees for
any q the draft really sampled from.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specexp.errors import UserInputError
from specexp.ngram.storage import load_npz, save_npz

MAX_ORDER = 8
HASH_SEED = np.uint64(0x9E3779B97F4A7C15)
HASH_MULT = np.uint64(0x100000001B3)  # odd: multiplication is a bijection mod 2^64
MASK64 = (1 << 64) - 1


def check_order(order: int) -> None:
    if not 1 <= order <= MAX_ORDER:
        raise UserInputError(f"n-gram order {order} is not allowed; it must be in 1..{MAX_ORDER}")


def hash_extend(keys: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Keys of sequences one token longer: key * MULT + (token + 1), mod 2^64."""
    with np.errstate(over="ignore"):
        return keys * HASH_MULT + (tokens.astype(np.uint64) + np.uint64(1))


def hash_tokens(tokens: list[int]) -> int:
    """The same hash for one short sequence, in Python ints."""
    key = int(HASH_SEED)
    for t in tokens:
        key = (key * int(HASH_MULT) + t + 1) & MASK64
    return key


def discount(counts: np.ndarray) -> float:
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    if n1 == 0 or n2 == 0:
        return 0.5
    return float(np.clip(n1 / (n1 + 2 * n2), 0.05, 0.95))


@dataclass
class OrderTable:
    """Counts of one order, sorted by (context key, token)."""

    context_keys: np.ndarray  # [C] uint64: distinct contexts, sorted
    context_start: np.ndarray  # [C] int64: first row of each context in tokens/counts
    context_types: np.ndarray  # [C] int64: distinct tokens after the context, T_n(h)
    context_total: np.ndarray  # [C] float64: c_n(h)
    tokens: np.ndarray  # [R] int64: the w of each (h, w)
    counts: np.ndarray  # [R] float64: c_n(h, w)
    discount: float

    @classmethod
    def from_pairs(cls, context: np.ndarray, token: np.ndarray, count: np.ndarray) -> "OrderTable":
        order = np.lexsort((token, context))
        context, token, count = context[order], token[order], count[order].astype(np.float64)
        keys, start, types = np.unique(context, return_index=True, return_counts=True)
        total = np.add.reduceat(count, start) if len(count) else np.zeros(0)
        return cls(keys, start.astype(np.int64), types.astype(np.int64), total, token.astype(np.int64), count,
                   discount(count))


def build_tables(stream: np.ndarray, order: int) -> list[OrderTable]:
    """Raw counts at the highest order, continuation counts below it. stream: [M] int64 token ids."""
    M = len(stream)
    keys = [np.full(M, HASH_SEED, dtype=np.uint64)]  # keys[n][pos] = hash(stream[pos : pos+n])
    for n in range(1, order + 1):
        keys.append(hash_extend(keys[n - 1][: max(M - n + 1, 0)], stream[n - 1 :]))
    tables = []
    for n in range(1, order + 1):
        if n == order:
            _, pos, count = np.unique(keys[n], return_index=True, return_counts=True)
        else:
            # Continuation count of (h, w): distinct tokens seen right before it = distinct
            # (n+1)-grams whose last n tokens are (h, w).
            _, first = np.unique(keys[n + 1], return_index=True)
            suffix_pos = first + 1
            _, idx, count = np.unique(keys[n][suffix_pos], return_index=True, return_counts=True)
            pos = suffix_pos[idx]
        tables.append(OrderTable.from_pairs(keys[n - 1][pos], stream[pos + n - 1], count))
    return tables


class KneserNeyLM:
    def __init__(self, tables: list[OrderTable], vocab_size: int, fingerprint: str):
        self.tables = tables  # tables[n-1] holds order n
        self.order = len(tables)
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint  # which tokenizer the ids came from

    @classmethod
    def build(cls, stream: np.ndarray, order: int, vocab_size: int, fingerprint: str) -> "KneserNeyLM":
        check_order(order)
        if len(stream) == 0:
            raise UserInputError("the n-gram corpus is empty; give text or generations with at least one token")
        stream = np.asarray(stream, dtype=np.int64)
        if stream.min() < 0 or stream.max() >= vocab_size:
            raise UserInputError(f"corpus token ids must lie in 0..{vocab_size - 1}")
        return cls(build_tables(stream, order), vocab_size, fingerprint)

    def distribution(self, context: list[int]) -> np.ndarray:
        """P(next token | context) over the whole vocabulary [V] float64; uses the last order-1 tokens."""
        p = np.full(self.vocab_size, 1.0 / self.vocab_size)
        for n, table in enumerate(self.tables, start=1):
            if n - 1 > len(context):
                break
            key = hash_tokens(context[len(context) - (n - 1) :])
            i = int(np.searchsorted(table.context_keys, np.uint64(key)))
            if i == len(table.context_keys) or int(table.context_keys[i]) != key:
                continue  # unseen context: keep the lower-order estimate
            a, b = table.context_start[i], table.context_start[i] + table.context_types[i]
            total, d = table.context_total[i], table.discount
            p *= d * table.context_types[i] / total
            p[table.tokens[a:b]] += (table.counts[a:b] - d) / total
        return p

    def save(self, path: str | Path) -> None:
        arrays = {}
        for n, t in enumerate(self.tables, start=1):
            for field in ("context_keys", "context_start", "context_types", "context_total", "tokens", "counts"):
                arrays[f"{n}_{field}"] = getattr(t, field)
        meta = {"kind": "kneser_ney", "order": self.order, "vocab_size": self.vocab_size,
                "fingerprint": self.fingerprint, "discounts": [t.discount for t in self.tables]}
        save_npz(path, meta, arrays)

    @classmethod
    def load(cls, path: str | Path) -> "KneserNeyLM":
        meta, arrays = load_npz(path, "kneser_ney")
        tables = []
        for n, d in enumerate(meta["discounts"], start=1):
            fields = {f: arrays[f"{n}_{f}"] for f in ("context_keys", "context_start", "context_types",
                                                       "context_total", "tokens", "counts")}
            tables.append(OrderTable(**fields, discount=d))
        return cls(tables, meta["vocab_size"], meta["fingerprint"])
