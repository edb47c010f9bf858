"""The lean decoder forward against transformers' forward, the reference runtime=hf keeps: every
supported architecture, fused projections, taps, split forwards, and which models take it."""

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from specexp.core.kv import StaticRaggedKV
from specexp.core.masks import attention_mask_4d
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.errors import UserInputError
from specexp.runtime.decoder import LeanDecoder, lean_decoder, unsupported_reason

TINY = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
ARCHITECTURES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**TINY)),
    "llama-bias": lambda: LlamaForCausalLM(LlamaConfig(**TINY, attention_bias=True, mlp_bias=True)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**TINY, sliding_window=None)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**TINY)),  # q/k/v biases
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**TINY)),  # per-head q/k norms
    # q/k norms, norms after attention and MLP, a scaled embedding, a tied head, a logit cap, and a window of
    # 4 (the passes reach ~40 tokens) on two of three layers with their own rope base
    "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(
        **TINY, sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=16, final_logit_softcapping=3.0)),
}


def tiny(arch: str):
    torch.manual_seed(0)
    model = ARCHITECTURES[arch]().to(torch.float64).eval()
    with torch.no_grad():  # biases start at zero: make them count
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_logits_equal_transformers_through_ragged_rewinds(arch, fuse):
    """B = 3 left-padded rows on the static cache, passes of K + 1 = 2..9 tokens, per-row rewinds."""
    model = tiny(arch)
    decoder = LeanDecoder(model, fuse_projections=fuse)
    g = torch.Generator().manual_seed(1)
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    P = max(map(len, prompts))
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    committed = [list(p) for p in prompts]
    kv = StaticRaggedKV.for_model(decoder, 3, capacity=16, device=torch.device("cpu"))
    with torch.no_grad():
        kv.forward(decoder, ids, mask)
        for k in range(1, 9):
            new = torch.randint(2, 48, (3, k + 1), generator=g)
            logits = kv.forward(decoder, new, logits_to_keep=k + 1)  # [3, K+1, V]
            for b in range(3):
                fresh = model(torch.tensor([committed[b] + new[b].tolist()])).logits[0, -(k + 1):]
                torch.testing.assert_close(logits[b], fresh, rtol=1e-10, atol=1e-10)
            drop = torch.randint(0, k + 2, (3,), generator=g)
            kv.drop_last(drop)
            for b in range(3):
                committed[b] += new[b, : k + 1 - int(drop[b])].tolist()


def test_fused_weights_are_views_and_transformers_forward_is_unchanged():
    model = tiny("qwen2")
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        before = model(ids).logits
        decoder = lean_decoder(model)
        assert lean_decoder(model) is decoder  # one decoder per model: the projections are fused once
        attn, mlp, fused = model.model.layers[0].self_attn, model.model.layers[0].mlp, decoder.layers[0]
        assert attn.q_proj.weight.data_ptr() == fused.qkv.weight.data_ptr()  # same memory, nothing copied
        assert attn.v_proj.bias.data_ptr() > fused.qkv.bias.data_ptr()
        assert mlp.up_proj.weight.data_ptr() > fused.gate_up.weight.data_ptr()
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)
        # a change to the model's weights is a change to the decoder's: one set of numbers
        attn.k_proj.weight.mul_(2)
        torch.testing.assert_close(decoder(ids, logits_to_keep=0).logits, model(ids).logits, rtol=1e-10, atol=1e-10)


def test_taps_and_split_forwards_equal_transformers_hidden_states():
    model = tiny("llama")
    decoder = lean_decoder(model)
    ids = torch.tensor([[5, 9, 2, 7, 7, 30]])
    with torch.no_grad():
        reference = model(ids, output_hidden_states=True).hidden_states  # embeddings, then each layer's output
        layers = tuple(range(len(reference)))  # the embeddings, every layer's output, the normed last
        out = decoder(ids, logits_to_keep=0, hidden_layers=layers)
        for j in layers:
            torch.testing.assert_close(out.hidden_states[j], reference[j], rtol=1e-10, atol=1e-10)
        positions = torch.arange(6)[None]
        hidden = decoder.run_layers(decoder.embed(ids), range(2), None, None, positions)
        hidden = decoder.run_layers(hidden, range(2, 3), None, None, positions)
        torch.testing.assert_close(decoder.logits(hidden), model(ids).logits, rtol=1e-10, atol=1e-10)


def test_float32_default_target_matches_transformers_within_rounding(embedded_target):
    """The shipped target in fp32 (F.rms_norm, the rotation in 4 ops, fused GEMMs): within fp32 rounding."""
    model = embedded_target.model
    decoder = lean_decoder(model)
    ids = torch.tensor([[1, 504, 3458, 314, 260, 2381, 30]])
    with torch.no_grad():
        reference = model(ids).logits
        lean = decoder(ids, logits_to_keep=0).logits
    torch.testing.assert_close(lean, reference, rtol=1e-4, atol=1e-4)
    assert torch.equal(lean.argmax(-1), reference.argmax(-1))


def test_which_models_take_it():
    assert unsupported_reason(tiny("llama")) is None
    assert unsupported_reason(tiny("qwen3")) is None
    assert unsupported_reason(tiny("gemma3")) is None  # its sliding layers too
    assert "sliding window" in unsupported_reason(MistralForCausalLM(MistralConfig(**TINY, sliding_window=16)))
    assert "model_type 'gemma'" in unsupported_reason(GemmaForCausalLM(GemmaConfig(**TINY)))
    with pytest.raises(UserInputError, match="cannot run GemmaForCausalLM"):
        LeanDecoder(GemmaForCausalLM(GemmaConfig(**TINY)))


def test_small_lm_drafts_run_llama_drafts_through_it(target, other_draft):
    drafter = SmallLMDrafter(target, other_draft, k=2)
    assert drafter.forward_model is lean_decoder(other_draft.model)


def test_mask_is_causal_over_valid_slots_and_padding_queries_see_everything():
    valid = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1]])  # [B, S + T]: slot validity, the last T = 2 are new
    mask = attention_mask_4d(valid, 2)  # [B, 1, 2, 4]
    assert mask[0, 0].tolist() == [[False, True, True, False], [False, True, True, True]]
    # row 1: the first new query is padding and would see nothing: it sees every slot (no NaNs; never used)
    assert mask[1, 0].tolist() == [[True, True, True, True], [False, False, False, True]]


def test_int8_drafts_fuse_their_projections_exactly():
    """A draft with int8 weights (draft.quantize): q/k/v and gate/up become one int8 kernel each,
    its logits equal to the int8 model's own forward (per-channel scales concatenate exactly)."""
    from specexp.drafts.parts.quantize import quantize_linears
    from specexp.runtime.int8 import Int8WeightLinear

    model = quantize_linears(tiny("llama").float(), "int8")
    ids = torch.tensor([[5, 9, 2, 7, 7, 30], [4, 4, 8, 1, 40, 3]])
    with torch.no_grad():
        reference = model(ids).logits
        decoder = LeanDecoder(model)
        assert isinstance(decoder.layers[0].qkv, Int8WeightLinear) and isinstance(decoder.layers[0].gate_up,
                                                                                  Int8WeightLinear)
        torch.testing.assert_close(decoder(ids, logits_to_keep=0).logits, reference, rtol=0, atol=0)
        torch.testing.assert_close(model(ids).logits, reference, rtol=0, atol=0)  # its own forward reads the views
