"""A loaded model kept for the next job of the same process: each load gets its own module tree over the kept
weight tensors (and what is derived from them, e.g. a quantized copy, is kept with them)."""

import copy
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

T = TypeVar("T")


# A sweep's jobs run in one process and load the same target (and model drafts) again and again, and a
# load is slow (docs/lab_notes/code_measurements.md: reloading a sweep's target), so a small local model is
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
    are a kept load's own tensors, and afresh for any others. The next job's modules read the same sources,
    so it gets the first job's result instead of writing its own copy to fresh memory (the lean runtime's
    fused projections, a draft's int8 weights;
    docs/lab_notes/code_measurements.md: fused projections' memory). Kept as long as the load is; made as
    plain tensors whatever mode the first job ran in (an inference tensor would fail a later job that trains)."""
    identities = tuple(map(tensor_identity, sources))
    for kept in _reused.values():
        if kept.weights.issuperset(identities):
            if (what, identities) not in kept.derived:
                with torch.inference_mode(False), torch.no_grad():
                    kept.derived[what, identities] = derive()
            return kept.derived[what, identities]
    return derive()
