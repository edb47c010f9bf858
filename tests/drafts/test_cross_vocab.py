"""Drafts of another tokenizer (drafts/cross_vocab.py): the shared tokens are matched by bytes, and
both mappings (tli, string) keep greedy output identical to the target and sampled output
distributed as the target's.

Two real tokenizers are trained here with `tokenizers`: the target's a SentencePiece-style BPE
(Metaspace, '▁' for a space, an <unk> for what its alphabet lacks) of 16 tokens, so the joint of
3 new tokens (16^3 cells) is enumerated exactly; the draft's a byte-level BPE (GPT-2 style) of
~290 tokens trained on other text, whose merges split words differently. The prompts hold
target-token sequences the target's tokenizer would not produce (boundaries the draft re-encodes
differently), its EOS (a special token the draft never sees as text), and text with bytes
('é', '€') the target's vocabulary lacks.

False failures: each distribution test fails by chance with probability P_VALUE_THRESHOLD (1e-4);
its power is stated like test_exactness's (the smallest TVD it detects with probability 0.9).
"""

import copy
import json
import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specexp.core import engine
from specexp.core.sampling import SamplingConfig
from specexp.drafts.cross_vocab import CrossVocabDrafter
from specexp.drafts.parts.vocab_map import token_bytes, vocab_map
from specexp.drafts.small_lm import SmallLMDrafter, small_lm_draft
from specexp.errors import UserInputError
from tests.commands import SMOKE_STUDY, run_each_study, run_smoke_study
from tests.conftest import EOS, tiny_model
from tests.stats import P_VALUE_THRESHOLD, detectable_tvd, exact_joint, grouped_chi_square

ROWS = 2000  # decoded rows per prompt and sampled test
MAX_DETECTABLE_TVD = 0.15
NO_EOS = [10**6]


def words(seed: int, n: int, letters: str) -> list[str]:
    rng = random.Random(seed)
    return [" ".join("".join(rng.choice(letters) for _ in range(rng.randint(1, 4))) for _ in range(12))
            for _ in range(n)]


def target_tokenizer() -> PreTrainedTokenizerFast:
    """16 tokens: <unk>, <eos> (id 1 = the tiny models' EOS), 'a', 'b', 'c', '▁' and ten merges."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=16, special_tokens=["<unk>", "<eos>"], initial_alphabet=list("abc▁"))
    tokenizer.train_from_iterator(words(0, 400, "aabbc"), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")


def draft_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE: every byte, then merges learned from other text (more 'c', some 'é')."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=292, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(words(1, 400, "abccé"), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


@pytest.fixture(scope="module")
def cross_pair():
    target_tok, draft_tok = target_tokenizer(), draft_tokenizer()
    assert len(target_tok) == 16
    target = tiny_model(30, layers=2, vocab_size=len(target_tok), scale=6.0)  # sharp, like an LM
    draft = tiny_model(31, layers=1, vocab_size=len(draft_tok), scale=6.0)
    target.tokenizer, draft.tokenizer = target_tok, draft_tok
    text_ids = target_tok("ab ca bcab aa")["input_ids"]
    unk_ids = target_tok("aé b€c")["input_ids"]  # characters the target lacks: <unk>
    assert target_tok.unk_token_id in unk_ids
    prompts = [text_ids, [2, 3, 2, 3, 4, 5, 2] + [EOS] + text_ids[:3], unk_ids + [5, 5]]  # ragged, odd boundaries
    return target, draft, prompts


def test_shared_tokens_are_matched_by_their_bytes(cross_pair):
    target, draft, _ = cross_pair
    target_bytes, draft_bytes = token_bytes(target.tokenizer), token_bytes(draft.tokenizer)
    assert target_bytes[:2] == [None, None] and draft_bytes[:2] == [None, None]  # special tokens spell no text
    assert target_bytes[target.tokenizer.convert_tokens_to_ids("▁")] == b" "
    assert draft_bytes[draft.tokenizer.convert_tokens_to_ids("Ġ")] == b" "
    assert draft_bytes[draft.tokenizer.convert_tokens_to_ids("Ã")] == bytes([0xC3])  # the first byte of 'é'
    mapping = vocab_map(draft.tokenizer, target.tokenizer, draft.vocab_size)
    for draft_id in mapping.shared.nonzero().flatten().tolist():
        assert draft_bytes[draft_id] == target_bytes[int(mapping.to_target[draft_id])]
    assert {b" ", b"a", b"b", b"c"} <= {draft_bytes[i] for i in mapping.shared.nonzero().flatten().tolist()}
    assert 0 < mapping.overlap < 0.1  # 292 draft tokens, at most 14 of them spelled by the target


def test_small_lm_picks_the_cross_vocabulary_drafter_and_refuses_what_it_cannot_do(cross_pair):
    target, draft, _ = cross_pair
    assert isinstance(small_lm_draft(target, target, k=2), SmallLMDrafter)
    built = small_lm_draft(target, draft, k=2, vocab_mapping="string", min_overlap=0.01)
    assert isinstance(built, CrossVocabDrafter) and built.traits.k_max == 2
    with pytest.raises(UserInputError,
                       match=r"vocabulary overlap 0\.0\d\d between draft .* below draft.min_overlap=0.5"):
        small_lm_draft(target, draft, min_overlap=0.5)
    with pytest.raises(UserInputError, match="draft.vocab_mapping=bytes is not allowed; choose one of: tli, string"):
        small_lm_draft(target, draft, vocab_mapping="bytes", min_overlap=0.01)
    with pytest.raises(UserInputError, match="drafts chains"):
        small_lm_draft(target, draft, branches=2, min_overlap=0.01)
    untokenized = tiny_model(31, layers=1, vocab_size=len(draft.tokenizer))
    with pytest.raises(UserInputError, match="vocab mismatch"):
        small_lm_draft(target, untokenized)


@pytest.mark.parametrize("mapping", ["tli", "string"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_the_target_s(cross_pair, mapping, k):
    target, draft, prompts = cross_pair
    drafter = CrossVocabDrafter(target, draft, k=k, vocab_mapping=mapping, min_overlap=0.01)
    ar = engine.generate(target.model, prompts, None, SamplingConfig(), 24, NO_EOS, torch.Generator().manual_seed(0))
    spec = engine.generate(target.model, prompts, drafter, SamplingConfig(), 24, NO_EOS,
                           torch.Generator().manual_seed(0))
    assert spec.tokens == ar.tokens
    assert int(spec.n_proposed.sum()) > 0
    # every drafted round re-encoded text and reported it within its draft time; AR rounds none
    assert all(0 < r <= d for r, d in zip(spec.reencode_s, spec.draft_s, strict=True))
    assert ar.reencode_s == [0.0] * len(ar.draft_s)


V = 16
SAMPLINGS = {"t1": SamplingConfig(temperature=1.0), "t0.8_top-k3": SamplingConfig(temperature=0.8, top_k=3),
             "t1.3_top-p0.7": SamplingConfig(temperature=1.3, top_p=0.7)}


def sampled_case(cross_pair, mapping: str, k: int, sampling_name: str) -> tuple[float, float, int]:
    """(p-value, detectable TVD, accepted draft tokens) of ROWS decodes per prompt of 4 new tokens."""
    target, draft, prompts = cross_pair
    sampling = SAMPLINGS[sampling_name]
    expected = torch.stack([exact_joint(target, p, sampling) for p in prompts])  # [3, V^3]
    drafter = CrossVocabDrafter(target, draft, k=k, vocab_mapping=mapping, min_overlap=0.01)
    out = engine.generate(target.model, prompts * ROWS, drafter, sampling, 4, NO_EOS, torch.Generator().manual_seed(k))
    cells = torch.tensor([(t[0] * V + t[1]) * V + t[2] for t in out.tokens])
    counts = torch.stack([torch.bincount(cells[i :: len(prompts)], minlength=V**3) for i in range(len(prompts))])
    p_value, dof = grouped_chi_square(counts, expected)
    return p_value, detectable_tvd(ROWS, dof), int(out.n_accepted.sum())


@pytest.mark.parametrize(("mapping", "k", "sampling_name"), [
    ("tli", 3, "t1.3_top-p0.7"), ("string", 2, "t0.8_top-k3"),
    pytest.param("tli", 1, "t1", marks=pytest.mark.slow), pytest.param("tli", 5, "t0.8_top-k3", marks=pytest.mark.slow),
    pytest.param("string", 1, "t1.3_top-p0.7", marks=pytest.mark.slow),
    pytest.param("string", 4, "t1", marks=pytest.mark.slow),
])
def test_sampled_tokens_1_to_3_follow_the_target(cross_pair, mapping, k, sampling_name):
    p_value, tvd, accepted = sampled_case(cross_pair, mapping, k, sampling_name)
    assert tvd <= MAX_DETECTABLE_TVD, f"too few rows: this case only detects a TVD >= {tvd:.3f}"
    assert p_value > P_VALUE_THRESHOLD, (f"{mapping} K={k} {sampling_name}: tokens 1..3 do not follow the target "
                                         f"(p = {p_value:.2e}; detects a TVD >= {tvd:.3f} with probability 0.9)")
    assert accepted > 0, "no draft token was accepted: the draft path was not exercised"


def test_a_wrong_q_is_caught(cross_pair, monkeypatch):
    """The control: tli with q left unrenormalised on the shared tokens (the draft's full-vocabulary
    softmax, as if the tokens it cannot propose kept their mass) must fail."""
    import specexp.drafts.cross_vocab as cross_vocab

    real = cross_vocab.logits_to_probs

    def unrenormalised(logits, sampling):
        q = real(logits, sampling)
        return q * 0.5 if logits.shape[-1] < 100 else q  # the shared tokens' q, half its mass missing

    monkeypatch.setattr(cross_vocab, "logits_to_probs", unrenormalised)
    p_value, _, _ = sampled_case(cross_pair, "tli", 3, "t1")
    assert p_value < P_VALUE_THRESHOLD, f"a wrong q passed (p = {p_value:.3f})"


@pytest.fixture(scope="module")
def byte_level_draft_folder(tmp_path_factory, cross_pair):
    """A tiny draft LM of the byte-level tokenizer saved as an HF folder (model + tokenizer)."""
    _, draft, _ = cross_pair
    folder = tmp_path_factory.mktemp("byte_level_draft")
    copy.deepcopy(draft.model).float().save_pretrained(folder)
    draft.tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.default_target
@pytest.mark.parametrize("mapping", ["tli", "string"])
def test_a_draft_of_another_tokenizer_runs_from_the_cli_on_the_default_target(byte_level_draft_folder, tmp_path,
                                                                              mapping):
    """draft=small_lm with a model folder of another tokenizer (the real local-path code path): the
    study runs it through the cross-vocabulary drafter, greedy identical to the target."""
    run_dir = tmp_path / "run"
    out = run_smoke_study("draft=small_lm", f"draft.model={byte_level_draft_folder}", f"draft.vocab_mapping={mapping}",
                          "draft.k=2", "profile.enabled=false", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # its config (the drafter: cross-vocabulary)
    assert summary["greedy_match"] == 1.0 and summary["draft"] == "small_lm"
    assert 0.05 < summary["vocab_overlap"] <= 1 and summary["reencode_ms_per_round"] > 0
    assert 0 < summary["time_split"]["draft_reencode"] < summary["time_split"]["draft"]


BAD_CROSS_VOCAB = {
    "draft.vocab_mapping=bytes": "draft.vocab_mapping=bytes is not allowed; choose one of: tli, string",
    "draft.min_overlap=0.99": "below draft.min_overlap=0.99",
}


@pytest.fixture(scope="module")
def bad_cross_vocab_runs(byte_level_draft_folder, tmp_path_factory) -> dict:
    """Each BAD_CROSS_VOCAB smoke study in one interpreter: override -> (its run folder, CompletedProcess)."""
    draft = ["draft=small_lm", f"draft.model={byte_level_draft_folder}"]
    return run_each_study(tmp_path_factory.mktemp("bad_cross_vocab"),
                          {override: [*SMOKE_STUDY, *draft, override, "draft.k=2", "profile.enabled=false"]
                           for override in BAD_CROSS_VOCAB})


@pytest.mark.default_target
@pytest.mark.xdist_group("bad_cross_vocab_runs")  # one worker: the batch runs once
@pytest.mark.parametrize("override", BAD_CROSS_VOCAB)
def test_bad_cross_vocabulary_settings_are_one_line(override, bad_cross_vocab_runs):
    run_dir, out = bad_cross_vocab_runs[override]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 2 and len(errors) == 1 and BAD_CROSS_VOCAB[override] in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr and not run_dir.exists()
