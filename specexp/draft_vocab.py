"""A reduced draft vocabulary: the draft predicts only N frequent target tokens.

The LM head dominates a small draft's cost (docs/lab_notes/code_measurements.md: the LM head's
share), so a draft that scores N << V tokens is much cheaper. Draft ids 0..N-1 are the
kept target ids; draft id N is "any other token", used for inputs only. On output the draft's
"other" column is dropped and q is renormalised over the kept tokens: q(x) = 0 outside them,
which keeps verification exact (the rule only needs q to be a distribution the draft sampled
from). Saved as `draft_vocab.json` next to the model, where `small_lm` finds it.
"""

import hashlib
import json
import weakref
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from specexp.core.sampling import SamplingConfig, draw
from specexp.errors import UserInputError

DRAFT_VOCAB_FILE = "draft_vocab.json"


def vocab_fingerprint(target) -> str:
    """Identifies a target's token-id space (``target``: a models.LoadedModel): a hash of its tokenizer's
    vocabulary (or its size). A draft vocabulary, an n-gram file or a head keeps the one it was made for."""
    if target.tokenizer is None:
        return f"vocab_size={target.vocab_size}"
    return f"vocab_size={target.vocab_size}:sha256={vocab_hash(target.tokenizer)}"


# Hashes kept by tokenizer and its length, because a feature head's load and an n-gram job each ask several
# times for a hash that is slow to make (docs/lab_notes/code_measurements.md: vocabulary hash), and a
# tokenizer that gained tokens must be hashed again.
_VOCAB_HASHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # PreTrainedTokenizerBase -> (len, hash)


def vocab_hash(tokenizer) -> str:
    """A hash of a tokenizer's vocabulary (kept per tokenizer until it gains tokens)."""
    size, kept = len(tokenizer), _VOCAB_HASHES.get(tokenizer)
    if kept is None or kept[0] != size:
        vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
        kept = _VOCAB_HASHES[tokenizer] = size, hashlib.sha256(vocab).hexdigest()[:16]
    return kept[1]


def frequent_tokens(documents: Iterable[list[int]], n: int, always: Iterable[int] = ()) -> list[int]:
    """The n most frequent target ids in documents (ties by id), always including `always`."""
    counts = Counter()
    for doc in documents:
        counts.update(doc)
    must = sorted(set(always))
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if t not in must]
    if n < len(must) + 1:
        raise UserInputError(f"draft vocabulary size {n} is too small; "
                             f"it must exceed the {len(must)} ids it always keeps")
    return sorted(must + ranked[: n - len(must)])


class DraftVocab:
    """Maps between the target's ids [0, V) and the draft's [0, N]; N is the "other" slot."""

    def __init__(self, target_ids: list[int], target_vocab_size: int, fingerprint: str | None = None):
        ids = torch.as_tensor(target_ids, dtype=torch.long)  # [N], draft id -> target id
        if (ids.numel() == 0 or ids.unique().numel() != ids.numel() or int(ids.min()) < 0
                or int(ids.max()) >= target_vocab_size):
            raise UserInputError(f"a draft vocabulary needs distinct target ids in [0, {target_vocab_size})")
        self.target_ids, self.target_vocab_size, self.fingerprint = ids, target_vocab_size, fingerprint
        self.size = ids.numel()  # N; the draft model has N + 1 outputs
        self._to_draft = torch.full((target_vocab_size,), self.size, dtype=torch.long)  # [V]
        self._to_draft[ids] = torch.arange(self.size)

    def to_draft(self, tokens: torch.Tensor) -> torch.Tensor:
        """Target ids [...] -> draft ids [...] (ids outside the vocabulary -> N)."""
        self._to_draft = self._to_draft.to(tokens.device)
        return self._to_draft[tokens]

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids [...] (kept tokens only, < N) -> target ids [...]."""
        self.target_ids = self.target_ids.to(draft_ids.device)
        return self.target_ids[draft_ids]

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., N+1] -> target-space logits [..., V], -inf outside the kept ids."""
        self.target_ids = self.target_ids.to(logits.device)
        out = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        return out.index_copy_(-1, self.target_ids, logits[..., : self.size])

    def to_target_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """Probabilities over the kept tokens [..., N] -> target space [..., V], 0 elsewhere."""
        self.target_ids = self.target_ids.to(probs.device)
        out = probs.new_zeros((*probs.shape[:-1], self.target_vocab_size))
        return out.index_copy_(-1, self.target_ids, probs)

    def sample(self, logits: torch.Tensor, cfg: SamplingConfig,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits [B, N+1] -> a token [B] (target id) and its q [B, V], 0 outside the kept ids.

        Warps and samples over the N kept tokens, not V: the same distribution as warping V
        logits that are -inf elsewhere (with ascending kept ids, as `frequent_tokens` gives, even
        the inverse-CDF draw picks the same token for the same u), without passes over all V.
        """
        token, q = draw(logits[..., : self.size], cfg, generator)  # [B], [B, N]
        return self.to_target(token), self.to_target_probs(q)

    def kept_log_probs(self, log_p: torch.Tensor) -> torch.Tensor:
        """Target log-probabilities [..., V] -> [..., N]: the kept ids', renormalised over them (what a
        head without the "other" slot, EAGLE-3's as published, is trained towards)."""
        self.target_ids = self.target_ids.to(log_p.device)
        kept = log_p.index_select(-1, self.target_ids)  # [..., N]
        return kept - kept.logsumexp(-1, keepdim=True)

    def offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The published EAGLE-3 form: d2t [N] (target id = draft id + d2t[draft id]) and t2d [V] (bool: kept)."""
        t2d = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        t2d[self.target_ids.cpu()] = True
        return self.target_ids.cpu() - torch.arange(self.size), t2d

    @classmethod
    def from_offsets(cls, d2t: torch.Tensor, target_vocab_size: int, fingerprint: str | None = None) -> "DraftVocab":
        """The vocabulary of a published EAGLE-3 head from its d2t [N]."""
        return cls((torch.arange(len(d2t)) + d2t.long().cpu()).tolist(), target_vocab_size, fingerprint)

    def coarsen_log_probs(self, log_p: torch.Tensor) -> torch.Tensor:
        """Target log-probabilities [..., V] -> [..., N+1]: the kept ids, then log P(any other)."""
        self.target_ids = self.target_ids.to(log_p.device)
        kept = log_p.index_select(-1, self.target_ids)  # [..., N]
        other = torch.log1p(-kept.exp().sum(-1).clamp(max=1 - 1e-7))  # [...]
        return torch.cat([kept, other[..., None]], dim=-1)

    def save(self, folder: str | Path) -> None:
        payload = {"target_ids": self.target_ids.tolist(), "target_vocab_size": self.target_vocab_size,
                   "vocab_fingerprint": self.fingerprint}
        (Path(folder) / DRAFT_VOCAB_FILE).write_text(json.dumps(payload))

    @classmethod
    def load(cls, folder: str | Path) -> "DraftVocab | None":
        """The vocabulary saved with a draft model, or None for a full-vocabulary draft."""
        path = Path(folder) / DRAFT_VOCAB_FILE
        if not path.is_file():
            return None
        payload = json.loads(path.read_text())
        return cls(payload["target_ids"], payload["target_vocab_size"], payload.get("vocab_fingerprint"))


def sample_draft(logits: torch.Tensor, draft_vocab: DraftVocab | None, cfg: SamplingConfig,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft's logits [B, V] (or [B, N+1] with a draft vocabulary) -> a token [B] (target id)
    and its q [B, V] in the target's space."""
    if draft_vocab is not None:
        return draft_vocab.sample(logits, cfg, generator)
    return draw(logits, cfg, generator)


def restrict_rows(weight: torch.Tensor, draft_vocab: DraftVocab | None) -> torch.Tensor:
    """Rows [V, H] of an embedding/LM head -> [N+1, H] (fp32): the kept tokens', then the mean of
    the others' for the "other" slot. Without a draft vocabulary, all V rows."""
    weight = weight.detach().float()
    if draft_vocab is None:
        return weight.clone()
    ids = draft_vocab.target_ids.to(weight.device)
    kept = weight[ids]  # [N, H]
    others = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
    others[ids] = False
    return torch.cat([kept, weight[others].mean(0, keepdim=True)])


def restricted_head(weight: torch.Tensor, draft_vocab: DraftVocab | None) -> nn.Linear:
    """An LM head [V, H] as a trainable fp32 nn.Linear over the draft vocabulary (restrict_rows),
    built on the meta device: initialising a vocabulary-sized matrix only to overwrite it costs
    a fraction of a second on every draft build."""
    rows = restrict_rows(weight, draft_vocab)  # [N+1, H]
    head = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
    head.weight = nn.Parameter(rows)
    return head
