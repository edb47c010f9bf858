"""`python -m specexp.ngram`: build drafts for the default target, use them, and clear errors."""

import json

import pytest

from specexp.drafts.ngram_lm import NgramLMDrafter
from specexp.drafts.retrieval import RetrievalDrafter
from specexp.errors import UserInputError
from tests.commands import run_each, run_module
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
    # the LM priced (a fresh file: its own quick profile), the datastore at a fixed K, unpriced
    for draft, path, pricing in (("ngram_lm", "lm.npz", []),
                                 ("retrieval", "store.npz", ["draft.k=2", "profile.enabled=false"])):
        run_dir = tmp_path / f"run_{draft}"
        out = run_module("specexp", f"draft={draft}", f"draft.path={tmp_path / path}", *pricing, "size=smoke",
                         "data.limit=1", "max_new_tokens=8", f"hydra.run.dir={run_dir}")
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads((run_dir / "summary.json").read_text())["greedy_match"] == 1.0


BUILD_ERRORS = {  # what `python -m specexp.ngram` is given -> what its one error line says
    "empty_corpus": (["lm", "--out", "x.npz", "--text", "{empty}"], "corpus is empty"),
    "order_too_high": (["lm", "--out", "x.npz", "--text", "{corpus}", "--order", "12"],
                       "order 12 is not allowed; it must be in 1..8"),
    "no_corpus": (["datastore", "--out", "x.npz"], "no corpus given"),
}


@pytest.fixture(scope="module")
def build_error_runs(tmp_path_factory) -> dict:
    """Each BUILD_ERRORS build in one interpreter: case -> (the file it must not write, CompletedProcess)."""
    folder = tmp_path_factory.mktemp("ngram_errors")
    (folder / "empty.txt").write_text("")
    (folder / "corpus.txt").write_text("some words\n")
    calls = {case: ("specexp.ngram", [a.format(empty=folder / "empty.txt", corpus=folder / "corpus.txt")
                                      .replace("x.npz", str(folder / f"{case}.npz")) for a in args])
             for case, (args, _) in BUILD_ERRORS.items()}
    return {case: (folder / f"{case}.npz", out) for case, out in run_each(calls).items()}


@pytest.mark.default_target
@pytest.mark.xdist_group("build_error_runs")  # one worker: the batch runs once
@pytest.mark.parametrize("case", BUILD_ERRORS)
def test_build_errors_are_one_line(case, build_error_runs):
    written, out = build_error_runs[case]
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: ") and BUILD_ERRORS[case][1] in out.stderr
    assert not written.exists()
