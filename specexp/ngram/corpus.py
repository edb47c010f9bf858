"""Token streams to build n-gram drafts from: text through `datasets`, and the target's own
generations on a prompt set (on-policy data). Documents are joined with the EOS token."""

import hashlib
import json

import numpy as np
import torch
from tqdm.auto import tqdm

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.data import Prompt, encode_prompts, load_any
from specexp.errors import UserInputError
from specexp.models import LoadedModel


def vocab_fingerprint(target: LoadedModel) -> str:
    """Identifies the token-id space: a hash of the tokenizer's vocabulary (or its size)."""
    if target.tokenizer is None:
        return f"vocab_size={target.vocab_size}"
    vocab = json.dumps(sorted(target.tokenizer.get_vocab().items())).encode()
    return f"vocab_size={target.vocab_size}:sha256={hashlib.sha256(vocab).hexdigest()[:16]}"


def check_fingerprint(built_for: str, target: LoadedModel, path: str) -> None:
    if built_for != vocab_fingerprint(target):
        raise UserInputError(
            f"'{path}' was built for another tokenizer/vocabulary ({built_for}); the target '{target.name}' "
            f"has {vocab_fingerprint(target)}; rebuild it with this target"
        )


def join_documents(documents: list[list[int]], separator: int) -> np.ndarray:
    """[d1, sep, d2, sep, ...] as one int64 stream."""
    out = []
    for doc in documents:
        out.extend(doc)
        out.append(separator)
    return np.asarray(out, dtype=np.int64)


def text_documents(target: LoadedModel, name_or_path: str, text_column: str = "text", split: str = "train",
                   max_documents: int | None = None) -> list[list[int]]:
    """Tokenized documents of a text data set (local files, a glob of text files, or an HF name)."""
    ds = load_any(name_or_path, split)
    if len(ds) and text_column not in ds.column_names:
        raise UserInputError(f"column '{text_column}' is not in '{name_or_path}'; its columns are {ds.column_names}")
    if max_documents is not None:
        ds = ds.select(range(min(max_documents, len(ds))))
    ids = ds.map(lambda batch: {"ids": target.tokenizer(batch[text_column])["input_ids"]}, batched=True,
                 remove_columns=ds.column_names, desc=f"tokenizing {name_or_path}")
    return [doc for doc in ids["ids"] if doc] if len(ids) else []


def generated_documents(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int, sampling: SamplingConfig,
                        batch_size: int = 8, seed: int = 0) -> list[list[int]]:
    """The target's own answers (chat-templated prompt + generation) on a prompt set."""
    encoded = encode_prompts(target.tokenizer, prompts)
    documents = []
    for start in tqdm(range(0, len(encoded), batch_size), desc="target generations", unit="batch"):
        batch = encoded[start : start + batch_size]
        generator = torch.Generator(device=target.model.device).manual_seed(seed + start)
        out = generate(target.model, batch, None, sampling, max_new_tokens, target.eos_token_ids, generator,
                       target.pad_token_id)
        documents += [prompt + tokens for prompt, tokens in zip(batch, out.tokens, strict=True)]
    return documents
