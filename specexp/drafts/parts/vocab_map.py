"""Two tokenizers' shared tokens: each vocabulary entry as the bytes it stands for, and the map
from a draft's token ids to the target's ids of the same bytes (Token-Level Intersection,
Timor et al. 2025). A byte-level BPE writes bytes as printable stand-ins (GPT-2's table: 'Ġ' is
a space); a SentencePiece-style vocabulary writes a space as '▁' and lone bytes as '<0xNN>'.
Comparing bytes, not strings, matches 'Ġthe' with '▁the' and 'Ċ' with '\\n'."""

import json
import re
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

from specexp.errors import UserInputError

BYTE_OF_CHAR = {char: byte for byte, char in bytes_to_unicode().items()}  # byte-level BPE's stand-ins
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def decoder_types(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The kinds of the fast tokenizer's decoder steps (ByteLevel, Metaspace, Replace, ByteFallback, ...)."""
    decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    return {step.get("type") for step in decoder.get("decoders", [decoder])}


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> list[bytes | None]:
    """Per token id, the bytes it stands for in text; None for special and added tokens (control
    tokens no text spells) and ids the vocabulary leaves empty."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserInputError(f"tokenizer '{tokenizer.name_or_path}' is not a fast (Rust) tokenizer; cross-vocabulary "
                             "drafts read its vocabulary through one")
    byte_level = "ByteLevel" in decoder_types(tokenizer)
    control = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    vocab = tokenizer.get_vocab()
    out: list[bytes | None] = [None] * (max(vocab.values()) + 1)
    for piece, token_id in vocab.items():
        if token_id in control:
            continue
        if byte_level:
            if all(char in BYTE_OF_CHAR for char in piece):
                out[token_id] = bytes(BYTE_OF_CHAR[char] for char in piece)
        elif match := BYTE_TOKEN.fullmatch(piece):
            out[token_id] = bytes([int(match.group(1), 16)])
        else:
            out[token_id] = piece.replace("▁", " ").encode("utf-8")
    return out


@dataclass(frozen=True)
class VocabMap:
    """Draft token id -> the target's id of the same bytes, -1 where the target has none."""

    to_target: torch.Tensor  # [V_d] long
    overlap: float  # shared tokens / the draft's text tokens

    @property
    def shared(self) -> torch.Tensor:
        """[V_d] bool: the draft tokens the target spells the same."""
        return self.to_target >= 0


def vocab_map(draft: PreTrainedTokenizerBase, target: PreTrainedTokenizerBase, draft_vocab_size: int) -> VocabMap:
    """The intersection of two vocabularies by bytes (``draft_vocab_size``: the draft's logits,
    which may pad past its tokenizer)."""
    target_ids = {}
    for token_id, spelled in enumerate(token_bytes(target)):
        if spelled:
            target_ids.setdefault(spelled, token_id)  # duplicates spell one token: keep the first id
    draft_bytes = token_bytes(draft)
    to_target = torch.full((draft_vocab_size,), -1, dtype=torch.long)
    for token_id, spelled in enumerate(draft_bytes[:draft_vocab_size]):
        if spelled and spelled in target_ids:
            to_target[token_id] = target_ids[spelled]
    n_text = sum(1 for spelled in draft_bytes if spelled)
    return VocabMap(to_target, float((to_target >= 0).sum()) / max(n_text, 1))


def check_overlap(mapping: VocabMap, floor: float, draft_name: str, target_name: str) -> None:
    """A pair whose vocabularies share almost nothing gains nothing from drafting: one line, not a slow run."""
    if mapping.overlap < floor:
        raise UserInputError(
            f"vocabulary overlap {mapping.overlap:.3f} between draft '{draft_name}' and target '{target_name}' "
            f"is below draft.min_overlap={floor} (the share of the draft's tokens the target spells the same); "
            f"pick a draft closer to the target's tokenizer or lower draft.min_overlap")
