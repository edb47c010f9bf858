"""Students: a small Llama-style causal LM on the target's vocabulary, from scratch or a checkpoint."""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from specexp.drafts.small_lm import check_same_vocabulary
from specexp.models import LoadedModel, load_model


def build_student(target: LoadedModel, init_from: str | None = None, hidden_size: int = 256, num_layers: int = 2,
                  num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 768,
                  tie_embeddings: bool = True, seed: int = 0) -> PreTrainedModel:
    """A fresh LlamaConfig student sharing the target's vocabulary, or an HF checkpoint (init_from)."""
    if init_from:
        student = load_model(init_from, dtype="float32", device="cpu")
        check_same_vocabulary(student, target)
        return student.model.train()
    text = target.model.config.get_text_config()
    config = LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size,
        max_position_embeddings=getattr(text, "max_position_embeddings", 2048), rope_theta=getattr(text, "rope_theta", 10000.0),
        bos_token_id=getattr(text, "bos_token_id", None), eos_token_id=getattr(text, "eos_token_id", None),
        pad_token_id=getattr(text, "pad_token_id", None), tie_word_embeddings=tie_embeddings,
    )
    torch.manual_seed(seed)
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    student.generation_config = target.model.generation_config
    return student.train()
