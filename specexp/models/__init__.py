"""Loading targets and drafts from hub names and local folders (the same code path), and what a loaded model
is: `LoadedModel`, its device and dtype, a draft of the target's first layers. The embedded targets (GGUF
conversion, Gemma-3's assembly) are models/embedded.py; the process-wide reuse of loaded models models/reuse.py."""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specexp.draft_vocab import DraftVocab
from specexp.errors import UserInputError
from specexp.models.reuse import keep_for_reuse, reuse_key, reused


@dataclass(frozen=True)
class StudentTraits:
    """What distillation needs to know of a model it trains, declared by the builder that makes it
    (conf/student/*.yaml's): the defaults are a causal LM's, on the target's ids or a draft vocabulary."""

    generates: bool = True  # continues text by itself: on-policy steps sample it (a causal LM; a head reads the target)
    reads_target_ids: bool = False  # takes the target's ids even with a reduced vocabulary (an exit head)
    reads_features: bool = False  # reads the target's hidden states (a FeatureHead): FeatureDistillModule trains it
    hf_folder: bool = True  # exports an HF model folder (tokenizer and draft vocabulary beside it); else its own


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # None for tiny test models that work on ids
    name: str
    draft_vocab: DraftVocab | None = None  # a reduced-vocabulary draft's map to its target's ids
    as_student: StudentTraits = StudentTraits()  # what distillation reads of it, when it is trained

    @property
    def vocab_size(self) -> int:
        """Size of the token-id space: the target's for a reduced-vocabulary draft."""
        if self.draft_vocab is not None:
            return self.draft_vocab.target_vocab_size
        return self.model.config.get_text_config().vocab_size

    @property
    def context_length(self) -> int | None:
        return getattr(self.model.config.get_text_config(), "max_position_embeddings", None)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted(set(ids))

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        return pad if pad is not None else 0


def resolve_device(device: str) -> torch.device:
    """auto: cuda where torch sees a GPU, else cpu; a device torch cannot name or this machine lacks is one line."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    available = ["auto", "cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserInputError(f"device={device} is not a device torch knows; "
                             f"allowed here: {', '.join(available)}") from None
    if resolved.type == "cuda" and (resolved.index or 0) >= torch.cuda.device_count():
        raise UserInputError(f"device={device} is not available: torch {torch.__version__} sees "
                             f"{torch.cuda.device_count()} CUDA devices; allowed here: {', '.join(available)}")
    if resolved.type not in ("cpu", "cuda"):
        raise UserInputError(f"device={device} is not one specexp runs on; allowed here: {', '.join(available)}")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # bf16 halves the bytes a GPU moves, but its GEMV is slower than fp32's on the CPUs we measured
        # (docs/lab_notes/code_measurements.md: bf16 on CPUs).
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise UserInputError(f"dtype '{dtype}' is not a torch dtype; allowed: auto, float32, bfloat16, float16")
    return getattr(torch, dtype)


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(device_map) -> str | dict | None:
    """None, one of accelerate's strategies, or an explicit {module name: device} map."""
    if device_map is None or isinstance(device_map, dict) or device_map in DEVICE_MAPS:
        return device_map
    raise UserInputError(f"target.device_map='{device_map}' is not allowed; choose one of {', '.join(DEVICE_MAPS)}, "
                         f"an explicit {{module: device}} map, or null")


def spread_over_devices(model: nn.Module) -> bool:
    """Whether accelerate placed the model's modules on more than one device (target.device_map)."""
    return len(set(map(str, (getattr(model, "hf_device_map", None) or {}).values()))) > 1


def load_model(name_or_path: str, dtype: str = "auto", device: str = "auto", gguf_file: str | None = None,
               device_map: str | dict | None = None, offload_folder: str | None = None) -> LoadedModel:
    """A causal LM and its tokenizer from a local folder or a hub name (the same code path).

    ``device_map`` (accelerate: auto, balanced, balanced_low_0, sequential, or {module: device})
    spreads a target too large for one device over several GPUs, or GPU and CPU; ``device`` then
    only picks the dtype default; modules mapped to "disk" are kept in ``offload_folder``."""
    local = Path(name_or_path).expanduser()
    if not local.exists() and _looks_like_path(name_or_path):
        raise UserInputError(
            f"model path '{name_or_path}' does not exist; give a local model folder or a hub name like 'org/name'"
        )
    source = str(local) if local.exists() else name_or_path
    torch_device = resolve_device(device)
    device_map = check_device_map(dict(device_map) if hasattr(device_map, "items") else device_map)
    torch_dtype = resolve_dtype(dtype, torch_device)
    key = reuse_key(local, gguf_file, torch_dtype, torch_device) if local.exists() and device_map is None else None
    if (kept := reused(key)) is not None:
        model, tokenizer = kept
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file, dtype=torch_dtype,
                                                         device_map=device_map, offload_folder=offload_folder)
        except (OSError, ValueError) as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserInputError(f"could not load model '{name_or_path}': {reason}") from e
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
        except (OSError, ValueError, TypeError):
            tokenizer = None  # a model folder without a tokenizer still works on token ids
        if device_map is None:
            model = keep_for_reuse(key, model.to(torch_device), tokenizer)
    return LoadedModel(model=model.eval(), tokenizer=tokenizer, name=name_or_path,
                       draft_vocab=DraftVocab.load(local) if local.is_dir() else None)


def first_layers(target: LoadedModel, n_layers: int) -> LoadedModel:
    """A same-vocabulary draft: the target's first n layers, its final norm and LM head, over the target's
    own weight tensors (nothing writes into a loaded model's weights; its modules are its own)."""
    config = target.model.config.__class__.from_dict(target.model.config.to_dict())
    total = config.get_text_config().num_hidden_layers
    if not 1 <= n_layers < total:
        raise UserInputError(f"n_layers={n_layers} must be in 1..{total - 1} for a {total}-layer target")
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n_layers]
    # On the meta device, because a random initialisation of weights that are assigned next is wasted time
    # (docs/lab_notes/code_measurements.md: meta-device drafts).
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(config, dtype=target.model.dtype)
    weights, buffers = target.model.state_dict(), dict(target.model.named_buffers())
    draft.load_state_dict({name: weights[name] for name in draft.state_dict()}, assign=True)
    for name, buffer in list(draft.named_buffers()):  # the ones a state dict leaves out (rotary frequencies)
        if buffer.is_meta:
            owner, _, attribute = name.rpartition(".")
            setattr(draft.get_submodule(owner), attribute, buffers[name])
    if config.get_text_config().tie_word_embeddings:
        draft.tie_weights()
    draft.generation_config = target.model.generation_config
    return LoadedModel(model=draft.to(target.model.device).eval(), tokenizer=target.tokenizer,
                       name=f"{target.name}-first{n_layers}")
