"""Students: small causal LMs on the target's vocabulary (or a reduced draft vocabulary of it),
from scratch, from an HF checkpoint, or initialised from the target's own weights."""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from specexp.draft_vocab import DraftVocab, restrict_rows
from specexp.drafts.small_lm import check_same_vocabulary
from specexp.errors import UserInputError
from specexp.models import LoadedModel, load_model


def _output_size(target: LoadedModel, draft_vocab: DraftVocab | None) -> int:
    return target.vocab_size if draft_vocab is None else draft_vocab.size + 1  # + the "other" slot


def build_student(target: LoadedModel, init_from: str | None = None, hidden_size: int = 256, num_layers: int = 2,
                  num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 768,
                  tie_embeddings: bool = True, seed: int = 0, draft_vocab: DraftVocab | None = None) -> LoadedModel:
    """A fresh LlamaConfig student, or an HF checkpoint (init_from, which brings its own vocabulary)."""
    if init_from:
        student = load_model(init_from, dtype="float32", device="cpu")
        check_same_vocabulary(student, target)
        student.model.train()
        return student
    text = target.model.config.get_text_config()
    config = LlamaConfig(
        vocab_size=_output_size(target, draft_vocab), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size,
        max_position_embeddings=getattr(text, "max_position_embeddings", 2048),
        rope_theta=getattr(text, "rope_theta", 10000.0),
        bos_token_id=getattr(text, "bos_token_id", None), eos_token_id=getattr(text, "eos_token_id", None),
        pad_token_id=getattr(text, "pad_token_id", None), tie_word_embeddings=tie_embeddings,
    )
    torch.manual_seed(seed)
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    student.generation_config = target.model.generation_config
    return LoadedModel(model=student.train(), tokenizer=target.tokenizer, name="student", draft_vocab=draft_vocab)


def student_from_target(target: LoadedModel, layers: list[int], draft_vocab: DraftVocab | None = None,
                        seed: int = 0) -> LoadedModel:
    """The target's architecture cut to some of its layers (copied), its norm, embeddings and
    head restricted to the draft vocabulary: a student that starts where the target is.

    The "other" slot starts at the mean embedding of the tokens it stands for.
    """
    text_config = target.model.config.get_text_config()
    total = text_config.num_hidden_layers
    if not layers or any(not 0 <= i < total for i in layers):
        raise UserInputError(f"student layers {list(layers)} must be indices in 0..{total - 1} of the target's layers")
    config = target.model.config.__class__.from_dict(target.model.config.to_dict())
    config.num_hidden_layers = len(layers)
    config.vocab_size = _output_size(target, draft_vocab)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    torch.manual_seed(seed)
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    source = target.model
    with torch.no_grad():
        for mine, theirs in zip(student.model.layers, [source.model.layers[i] for i in layers], strict=True):
            mine.load_state_dict(theirs.state_dict())
        student.model.norm.load_state_dict(source.model.norm.state_dict())
        student.model.embed_tokens.weight.copy_(restrict_rows(source.model.embed_tokens.weight, draft_vocab))
        if not config.tie_word_embeddings:
            student.lm_head.weight.copy_(restrict_rows(source.lm_head.weight, draft_vocab))
    student.generation_config = target.model.generation_config
    return LoadedModel(model=student.train(), tokenizer=target.tokenizer, name=f"student-from-{target.name}",
                       draft_vocab=draft_vocab)

