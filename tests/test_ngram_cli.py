"""`python -m specexp.ngram`: build drafts for the default target, use them, and clear errors."""

import json

import pytest

from specexp.drafts.ngram_lm import NgramLMDrafter
from specexp.drafts.retrieval import RetrievalDrafter
from specexp.errors import UserInputError
from tests.commands import run_module
from tests.conftest import build_ngram_files, tiny_model


def test_files_built_for_another_vocabulary_are_refused(tmp_path):
    files = build_ngram_files(tiny_model(0, vocab_size=64), tmp_path)
    other = tiny_model(1, vocab_size=80)
    with pytest.raises(UserInputError, match="built for another tokenizer/vocabulary"):
        NgramLMDrafter(other, files["lm"], k=2)
    with pytest.raises(UserInputError, match="built for another tokenizer/vocabulary"):
        RetrievalDrafter(other, files["store"], k=2)
    with pytest.raises(UserInputError, match="does not exist"):
        NgramLMDrafter(other, str(tmp_path / "missing.npz"))
    with pytest.raises(UserInputError, match="holds a suffix_datastore model"):
        NgramLMDrafter(tiny_model(0, vocab_size=64), files["store"])


@pytest.mark.default_target
def test_build_then_decode_with_each_ngram_draft(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"The answer to question {i} is that the answer is {i * 7}." for i in range(200)))
    for kind, name in (("lm", "lm.npz"), ("datastore", "store.npz")):
        out = run_module("specexp.ngram", kind, "--out", str(tmp_path / name), "--text", str(corpus), "--order", "4")
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"wrote {tmp_path / name}" in out.stdout
    for draft, path in (("ngram_lm", "lm.npz"), ("retrieval", "store.npz")):
        run_dir = tmp_path / f"run_{draft}"
        out = run_module("specexp", f"draft={draft}", f"draft.path={tmp_path / path}", "size=smoke", "data.limit=1",
                         "max_new_tokens=8", f"hydra.run.dir={run_dir}")
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads((run_dir / "summary.json").read_text())["greedy_match"] == 1.0


@pytest.mark.default_target
@pytest.mark.parametrize("args, message", [
    (["lm", "--out", "x.npz", "--text", "{empty}"], "corpus is empty"),
    (["lm", "--out", "x.npz", "--text", "{corpus}", "--order", "12"], "order 12 is not allowed; it must be in 1..8"),
    (["datastore", "--out", "x.npz"], "no corpus given"),
])
def test_build_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "corpus.txt").write_text("some words\n")
    args = [a.format(empty=tmp_path / "empty.txt", corpus=tmp_path / "corpus.txt").replace("x.npz", str(tmp_path / "x.npz"))
            for a in args]
    out = run_module("specexp.ngram", *args)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: ") and message in out.stderr
    assert not (tmp_path / "x.npz").exists()
