"""Corpus drafts out of the box: an n-gram LM or a retrieval datastore built once per target into
the specexp cache, the way the embedded target is converted once.

The corpus (text data sets and/or the target's own answers, `corpus_documents`) is built once
per target and corpus config and shared by both kinds; each kind is then built once per its own
parameters. Files are keyed by the target's name, its vocabulary fingerprint and the config, and
written under a file lock (parallel sweep jobs wait for one build) to a temporary name, then
renamed (a killed build leaves nothing that looks finished).
"""

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from filelock import FileLock

from specexp.draft_vocab import vocab_fingerprint
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.ngram.corpus import corpus_documents, join_documents
from specexp.ngram.datastore import SuffixDatastore
from specexp.ngram.kneser_ney import KneserNeyLM, check_order
from specexp.ngram.storage import load_npz, save_npz
from specexp.output import short_hash
from specexp.paths import cache_root

log = logging.getLogger(__name__)


def built_once(path: Path, build: Callable[[Path], None]) -> Path:
    """``build(path)`` unless the file exists, one process at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(path.name + ".lock"))):
        if not path.exists():
            build(path)
    return path


def cached_documents(target: LoadedModel, corpus: dict) -> list[list[int]]:
    """The corpus's token documents for this target, built once (the slow part: the target writes)."""
    if target.tokenizer is None:
        raise UserInputError(f"target '{target.name}' has no tokenizer to build a corpus with; give draft.path=FILE")
    path = cache_root() / "ngram" / f"corpus-{short_hash([target.name, vocab_fingerprint(target), corpus])}.npz"

    def build(out: Path) -> None:
        log.warning("building the n-gram corpus for %s into %s (one time)", target.name, out)
        documents = corpus_documents(target, **corpus)
        if not documents:
            raise UserInputError(f"draft.corpus={corpus} gives no documents; name a text data set or a prompt set")
        lengths = np.array([len(d) for d in documents], dtype=np.int64)
        save_npz(out, {"kind": "corpus", "corpus": corpus, "target": target.name},
                 {"tokens": np.concatenate([np.asarray(d, dtype=np.int64) for d in documents]), "lengths": lengths})

    _, arrays = load_npz(built_once(path, build), "corpus")
    ends = np.cumsum(arrays["lengths"])
    return [chunk.tolist() for chunk in np.split(arrays["tokens"], ends[:-1])]


def require_corpus(corpus: Mapping | None) -> dict:
    """The draft's corpus config as a plain dict; a one-line error when there is none to build from."""
    if not isinstance(corpus, Mapping):
        raise UserInputError(f"draft.corpus={corpus!r} is not allowed with draft.path=null; give draft.path=FILE "
                             f"(python -m specexp.ngram) or a corpus mapping (text, prompts, prompt_limit, ...)")
    return dict(corpus)


def cached_draft_file(kind: str, target: LoadedModel, corpus: dict, params: dict,
                      build_model: Callable[[list[list[int]]], object]) -> str:
    """Path of the ``kind`` file ('lm' or 'datastore') built from ``corpus`` with ``params``;
    ``build_model(documents)`` returns an object with ``save(path)``."""
    path = cache_root() / "ngram" / f"{kind}-{short_hash([target.name, vocab_fingerprint(target), corpus, params])}.npz"

    def build(out: Path) -> None:
        documents = cached_documents(target, corpus)
        log.warning("building the %s draft from %d documents (%d tokens) into %s (one time)", kind, len(documents),
                    sum(len(d) for d in documents), out)
        build_model(documents).save(out)

    return str(built_once(path, build))


def lm_from_documents(documents: list[list[int]], target: LoadedModel, order: int) -> KneserNeyLM:
    separator = target.eos_token_ids[0] if target.eos_token_ids else 0
    return KneserNeyLM.build(join_documents(documents, separator), order, target.vocab_size, vocab_fingerprint(target))


def datastore_from_documents(documents: list[list[int]], target: LoadedModel) -> SuffixDatastore:
    return SuffixDatastore.build(documents, target.vocab_size, vocab_fingerprint(target))


def cached_lm(target: LoadedModel, order: int, corpus: dict) -> str:
    """The order-``order`` Kneser-Ney LM of ``corpus`` for this target (built on first use)."""
    check_order(order)
    return cached_draft_file("lm", target, corpus, {"order": order},
                             lambda docs: lm_from_documents(docs, target, order))


def cached_datastore(target: LoadedModel, corpus: dict) -> str:
    """The suffix-array datastore of ``corpus`` for this target (built on first use)."""
    return cached_draft_file("datastore", target, corpus, {}, lambda docs: datastore_from_documents(docs, target))
