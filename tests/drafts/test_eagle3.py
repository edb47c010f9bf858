"""EAGLE-3 as published (drafts/parts/eagle3_head.py): drafting computes the training forward; the
speculators format round trips bit for bit; the EAGLE / SpecForge layout loads to the same head; the
format is detected from config.json; a head for another target is one line naming both. (Greedy identity
and chi-square exactness: the eagle3_published kinds of tests/drafters.py in test_engine.py and
test_exactness.py.)"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.distill.features import eagle3_student, prediction_losses, teacher_pass
from specexp.distill.objectives import objective
from specexp.drafts.eagle import EagleDrafter, resolve_head
from specexp.drafts.parts.eagle3_format import read_folder
from specexp.drafts.parts.eagle3_head import Eagle3Head
from specexp.errors import DraftDoesNotApply, UserInputError
from tests.conftest import tiny_model
from tests.drafters import eagle3_head

NO_EOS = [10**6]
SPECULATORS_KEYS = {"fc.weight", "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight",
                    "layers.0.post_attention_layernorm.weight", "layers.0.self_attn.q_proj.weight",
                    "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
                    "layers.0.self_attn.o_proj.weight", "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
                    "layers.0.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                    "embed_tokens.weight"}


def head_logits(head: Eagle3Head, target, steps: int = 2) -> list[torch.Tensor]:
    ids = torch.tensor([[5, 9, 2, 7, 7, 30, 11, 4]])
    features = teacher_pass(target.model, ids, head.hidden_layers)[1]
    with torch.no_grad():
        return [logits for logits, _ in head.unrolled(ids, features, steps)]


def test_the_speculators_folder_round_trips_bit_for_bit(target, tmp_path):
    head = eagle3_head(target, norm_before_residual=True, norm_before_fc=True, norm_output=True)
    head.save(tmp_path / "head")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["speculators_config"]["algorithm"] == "eagle3"
    assert config["speculators_config"]["verifier"]["name_or_path"] == target.name
    assert config["draft_vocab_size"] == head.draft_vocab.size and config["norm_before_fc"] is True
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # not the published default for 2 layers
    weights = load_file(tmp_path / "head" / "model.safetensors")
    assert set(weights) == SPECULATORS_KEYS | {"input_norm.weight"}
    # as speculators writes
    assert torch.equal(weights["embed_tokens.weight"], target.model.get_input_embeddings().weight)
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(head.draft_vocab.size) + weights["d2t"], head.draft_vocab.target_ids)
    loaded = resolve_head(target, str(tmp_path / "head"))
    assert type(loaded) is Eagle3Head and loaded.flags == head.flags and loaded.hidden_layers == (0, 1, 2)
    assert "embed_tokens.weight" not in loaded.state_dict()  # the target's own: shared, not held twice
    for a, b in zip(head_logits(head, target), head_logits(loaded, target), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_eagle_specforge_layout_loads_as_the_same_head(target, tmp_path):
    """midlayer.* weights, a Llama config with architectures [LlamaForCausalLMEagle3], SpecForge's
    layer-output ids (one less than hidden-state indices) and an embedding of its own load as the same head
    as those weights in the speculators format."""
    head = eagle3_head(target)
    head.save(tmp_path / "speculators")
    weights = load_file(tmp_path / "speculators" / "model.safetensors")
    weights["embed_tokens.weight"] = weights["embed_tokens.weight"] + 0.01  # its own
    save_file(weights, tmp_path / "speculators" / "model.safetensors")
    folder = tmp_path / "specforge"
    folder.mkdir()
    save_file({k.replace("layers.0.", "midlayer."): v for k, v in weights.items()}, folder / "model.safetensors")
    config = head.config.to_dict() | {"architectures": ["LlamaForCausalLMEagle3"],
                                      "draft_vocab_size": head.draft_vocab.size,
                                      "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 0, 1]}}
    (folder / "config.json").write_text(json.dumps(config))
    assert read_folder(folder).layout == "eagle" and read_folder(folder).aux_layers == (0, 1, 2)
    loaded, reference = resolve_head(target, str(folder)), resolve_head(target, str(tmp_path / "speculators"))
    assert loaded.hidden_layers == (0, 1, 2)
    assert torch.equal(loaded.state_dict()["embed_tokens.weight"], weights["embed_tokens.weight"].to(head.dtype))
    for a, b in zip(head_logits(reference, target), head_logits(loaded, target), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_loaded_head_drafts_what_it_was_trained_to_and_exactly(target, prompts, tmp_path):
    """The loaded head's chain q at step j is its training forward's step j, and greedy output is the target's."""
    head = eagle3_head(target)
    head.save(tmp_path / "head")
    drafter = EagleDrafter(target, resolve_head(target, str(tmp_path / "head")), k=3)
    alone = generate(target.model, prompts, None, SamplingConfig(), 16, NO_EOS, torch.Generator().manual_seed(0))
    spec = generate(target.model, prompts, drafter, SamplingConfig(), 16, NO_EOS, torch.Generator().manual_seed(0))
    assert spec.tokens == alone.tokens and int(spec.n_accepted.sum()) > 0


def test_mismatches_are_one_line_errors_naming_both(target, tmp_path):
    head = eagle3_head(target)
    head.save(tmp_path / "head")
    for other, why in ((tiny_model(0, layers=2, vocab_size=80), "vocabulary of \\[64\\] tokens; target"),
                       (tiny_model(0, layers=2, hidden=48), "width 32; target"),
                       (tiny_model(0, layers=1), "hidden states \\[0, 1, 2\\]; target")):
        with pytest.raises(DraftDoesNotApply, match=why) as error:
            resolve_head(other, str(tmp_path / "head"))
        assert "\n" not in str(error.value) and other.name in str(error.value)
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct"
    (tmp_path / "head" / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftDoesNotApply,
                       match="trained for verifier 'meta-llama/Llama-3.1-8B-Instruct'; the target is"):
        resolve_head(target, str(tmp_path / "head"))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserInputError, match="is not an EAGLE-3 head: its config.json has neither"):
        resolve_head(target, str(tmp_path / "plain"))


@pytest.mark.default_target
def test_the_shipped_head_is_the_published_architecture_and_skips_another_target(embedded_target, target):
    """draft.head=eagle3: a speculators folder for the default target (what vLLM serves), which a pairing
    sweep skips for a target of another width with one line."""
    from specexp.drafts.eagle import SHIPPED

    shipped = read_folder(SHIPPED["eagle3"])
    assert shipped.layout == "speculators" and shipped.verifier["name_or_path"].endswith("SmolLM2-135M-Instruct")
    assert "embed_tokens.weight" not in shipped.weights  # the target's, shared
    head = resolve_head(embedded_target, "eagle3")
    assert type(head) is Eagle3Head and head.hidden_layers == (2, 15, 27) and head.draft_vocab.size == 8192
    with pytest.raises(DraftDoesNotApply, match="reads hidden states of width 576; target") as error:
        resolve_head(target, "eagle3")
    assert "\n" not in str(error.value)


def test_a_hub_name_goes_through_huggingface_hub(target, monkeypatch):
    """Offline (as here) a hub name fails in one line saying it could not be fetched."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserInputError, match="draft.head=yuhuili/EAGLE3-LLaMA3.1-Instruct-8B is not a local folder"):
        resolve_head(target, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")


def test_the_student_trains_towards_the_kept_ids_and_exports_the_published_format(target, tmp_path):
    """student=eagle3: its loss is against the target renormalised over the kept ids (it has no "other"
    output), and its export is a speculators folder."""
    from specexp.draft_vocab import DraftVocab

    vocab = DraftVocab(list(range(0, 64, 2)), 64)
    student = eagle3_student(target, hidden_layers=[0, 1, 2], unroll_steps=2, draft_vocab=vocab)
    head = student.model
    ids = torch.randint(2, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    teacher_logits, features = teacher_pass(target.model, ids, head.hidden_layers)
    predictions = head.predictions(ids, features)
    assert [p.logits.shape[-1] for p in predictions] == [32, 32]
    losses = prediction_losses(head, predictions, teacher_logits, objective("forward_kl"), 1.0)
    assert all(torch.isfinite(loss) for loss in losses)
    sum(losses).backward()
    head.save_pretrained(tmp_path / "student")
    assert read_folder(tmp_path / "student").layout == "speculators"


def test_export_writes_the_speculators_format_with_the_verifier_vllm_loads(target, tmp_path):
    """python -m specexp.export: an EAGLE / SpecForge folder (or one trained here) -> speculators, verifier
    set; the folder loads back as the same head; bad input is one line, exit 2, nothing written."""
    from tests.commands import run_module

    head = eagle3_head(target)
    weights = {k.replace("layers.0.", "midlayer."): v for k, v in head.state_dict().items()}
    (tmp_path / "specforge").mkdir()
    save_file(weights, tmp_path / "specforge" / "model.safetensors")
    config = head.config.to_dict() | {"architectures": ["LlamaForCausalLMEagle3"],
                                      "draft_vocab_size": head.draft_vocab.size,
                                      "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 0, 1]}}
    (tmp_path / "specforge" / "config.json").write_text(json.dumps(config))
    out = run_module("specexp.export", str(tmp_path / "specforge"), "--out", str(tmp_path / "served"), "--verifier",
                     target.name, "--speculative-tokens", "4")
    assert out.returncode == 0, out.stderr[-2000:]
    written = json.loads((tmp_path / "served" / "config.json").read_text())
    assert written["speculators_config"]["verifier"]["name_or_path"] == target.name
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    # as held
    assert set(load_file(tmp_path / "served" / "model.safetensors")) == SPECULATORS_KEYS - {"embed_tokens.weight"}
    loaded = resolve_head(target, str(tmp_path / "served"))
    for a, b in zip(head_logits(head, target), head_logits(loaded, target), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # --dtype bfloat16 (how the shipped head and vLLM's heads are stored): floating weights cast, the maps kept
    out = run_module("specexp.export", str(tmp_path / "served"), "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16")
    assert out.returncode == 0, out.stderr[-2000:]
    stored = load_file(tmp_path / "bf16" / "model.safetensors")
    assert {w.dtype for k, w in stored.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}
    assert torch.equal(stored["d2t"], load_file(tmp_path / "served" / "model.safetensors")["d2t"])
    layer_config = json.loads((tmp_path / "bf16" / "config.json").read_text())["transformer_layer_config"]
    assert layer_config["dtype"] == "bfloat16"
    rounded = resolve_head(target, str(tmp_path / "bf16"))
    assert "embed_tokens.weight" not in rounded.state_dict()  # the target's, rounded: still shared
    assert {p.dtype for p in rounded.parameters()} == {target.model.dtype}  # computed in the target's dtype
    for a, b in zip(head_logits(head, target), head_logits(rounded, target), strict=True):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)
    for args, error in (([str(tmp_path / "specforge"), "--out", str(tmp_path / "x")], "names no verifier"),
                        ([str(tmp_path / "served"), "--out", str(tmp_path / "z"), "--dtype", "int8"],
                         "argument --dtype: invalid choice: 'int8'"),
                        ([str(tmp_path / "nothing"), "--out", str(tmp_path / "y")], "does not exist"),
                        ([str(tmp_path / "specforge"), "--out", str(tmp_path / "served")],
                         "exists; give a new folder")):
        bad = run_module("specexp.export", *args)
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and error in bad.stderr, bad.stderr
    assert not any((tmp_path / name).exists() for name in ("x", "y", "z"))
