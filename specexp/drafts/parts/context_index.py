"""An incremental n-gram index over one growing token sequence (prompt + committed tokens).

Maps every n-gram (min_n <= n <= max_n) that already has a following token to the start
positions of its occurrences, so a lookup costs one dict probe per n instead of a scan of
the whole context: O(max_n) per round at any context length.
"""

from collections import Counter


class ContextIndex:
    def __init__(self, max_n: int, min_n: int, max_candidates: int = 64):
        self.max_n, self.min_n = max_n, min_n
        self.max_candidates = max_candidates  # occurrences weighed by choice="frequent"
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ascending start positions

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: list[int]) -> None:
        """Append committed tokens; index each n-gram once the token after it is known."""
        tokens = self.tokens
        for token in new_tokens:
            j = len(tokens)  # position of the new token: n-grams ending at j-1 now have a continuation
            for n in range(self.min_n, min(self.max_n, j) + 1):
                self.starts.setdefault(tuple(tokens[j - n : j]), []).append(j - n)
            tokens.append(token)

    def lookup(self, k: int, choice: str = "recent") -> tuple[int, list[int]]:
        """(n, continuation): the longest n whose suffix n-gram occurred before, and up to k
        tokens that followed it: at the most recent occurrence ("recent"), the earliest
        ("first", what HF's prompt lookup takes), or the continuation seen most often among
        the last ``max_candidates`` ("frequent", ties to the most recent). (0, []) if none."""
        tokens, L = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            starts = self.starts.get(tuple(tokens[L - n :]))
            if starts:  # one dict probe per n: this runs every round of every row
                return n, list(next(self._ordered(starts, n, k, choice)))
        return 0, []

    def continuations(self, k: int, choice: str, branches: int) -> list[tuple[int, list[int]]]:
        """Up to ``branches`` different continuations (n, up to k tokens), best first: the longest
        matching n-gram's occurrences in the order ``choice`` prefers (see lookup), then shorter
        n-grams' (weaker evidence). Empty if the suffix never occurred before."""
        tokens, L = self.tokens, len(self.tokens)
        found: list[tuple[int, list[int]]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            starts = self.starts.get(tuple(tokens[L - n :]))
            if not starts:
                continue
            for continuation in self._ordered(starts, n, k, choice):
                if continuation not in seen:
                    seen.add(continuation)
                    found.append((n, list(continuation)))
                    if len(found) == branches:
                        return found
        return found

    def _ordered(self, starts: list[int], n: int, k: int, choice: str):
        """The continuations after an n-gram's occurrences (``starts``), in the order ``choice`` prefers."""
        tokens = self.tokens
        if choice == "first":
            return (tuple(tokens[s + n : s + n + k]) for s in starts)
        recent_first = [tuple(tokens[s + n : s + n + k]) for s in reversed(starts[-self.max_candidates :])]
        if choice == "recent":
            return iter(recent_first)
        counts = Counter(recent_first)
        return iter(sorted(counts, key=lambda c: -counts[c]))  # stable: ties keep the most recent first
