"""The drafts' lean Llama forward: which models take it, and its mask."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specexp.drafts.lean_llama import LeanLlama, attention_mask_4d, supports_lean_forward
from specexp.drafts.small_lm import SmallLMDrafter

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1)


def test_only_plain_llama_models_take_the_lean_forward():
    assert supports_lean_forward(LlamaForCausalLM(LlamaConfig(**TINY)).eval())
    assert not supports_lean_forward(LlamaForCausalLM(LlamaConfig(**TINY, attention_bias=True)).eval())
    assert not supports_lean_forward(Qwen2ForCausalLM(Qwen2Config(**TINY)).eval())
    assert not supports_lean_forward(LlamaForCausalLM(LlamaConfig(**TINY)).train())


def test_small_lm_drafts_run_llama_drafts_through_it(target, other_draft):
    assert isinstance(SmallLMDrafter(target, other_draft, k=2).forward_model, LeanLlama)


def test_mask_is_causal_over_valid_slots_and_padding_queries_see_everything():
    valid = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1]])  # [B, S + T]: slot validity, the last T = 2 are new
    mask = attention_mask_4d(valid, 2)  # [B, 1, 2, 4]
    assert mask[0, 0].tolist() == [[False, True, True, False], [False, True, True, True]]
    # row 1: the first new query is padding and would see nothing: it sees every slot (no NaNs; never used)
    assert mask[1, 0].tolist() == [[True, True, True, True], [False, False, False, True]]
