"""Host readbacks: the one transfer a round makes, and a counter of any other.

Reading a tensor's values on the host (``.item()``, ``bool``/``int`` of a tensor, ``.tolist()``,
``.cpu()``, ``.numpy()``, ``nonzero`` and boolean indexing, whose output size the host must learn)
waits, on a GPU, for everything queued before it: the host cannot prepare the next step while the
device computes. The engine reads the device back once per round, one packed transfer of what the
host needs (`read_back`); the rest it keeps on the host (`core.interface.HostView`).

`ReadbackCounter` counts them on any device, the CPU included, where they cost nothing. There a
tensor made from host data cannot be told from one on the device, so every read of a tensor's
values counts: host-side code keeps numpy arrays and lists, and moves them to the device with
``.to(device)``, which is never a readback.
"""

import traceback
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

# Reads of a tensor's values on the host (each a device synchronisation on a GPU), patched where Python calls
# them: an operator-level hook (TorchDispatchMode) does not see inference tensors.
READING_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero",
                   "unique", "masked_select", "repeat_interleave")
READING_FUNCTIONS = ("nonzero", "equal", "allclose", "unique", "masked_select", "repeat_interleave")


COUNTING: list["ReadbackCounter"] = []  # the counters entered, innermost last


def round_started() -> None:
    """The engine marks where each round begins, for the counters that split their count by round."""
    for counter in COUNTING:
        counter.round_starts.append(len(counter))


def read_back(**tensors: torch.Tensor) -> dict[str, np.ndarray]:
    """Integer or bool tensors, read on the host in one transfer: ``{name: array of the same shape}``."""
    flat = torch.cat([t.reshape(-1).long() for t in tensors.values()])
    values = flat.cpu().numpy()  # the one device synchronisation
    out, at = {}, 0
    for name, t in tensors.items():
        n = t.numel()
        out[name] = values[at : at + n].reshape(t.shape).astype(bool if t.dtype == torch.bool else np.int64)
        at += n
    return out


@dataclass
class Readback:
    kind: str  # the operator or method
    where: str  # the innermost specexp frame that asked: file:line function


def asking_frame() -> str:
    frames = [f for f in traceback.extract_stack()[:-2]
              if "/specexp/" in f.filename and "readbacks.py" not in f.filename]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.filename.split('/specexp/')[-1]}:{f.lineno} {f.name}"


class ReadbackCounter:
    """``with ReadbackCounter() as counter:`` counts every host read of a tensor's values in the block
    (``counter.readbacks``, each with the specexp line that asked); ``a.cpu().numpy()`` counts once."""

    def __init__(self):
        self.readbacks: list[Readback] = []
        self.round_starts: list[int] = []  # readbacks counted before each round began (the engine marks them)
        self._methods = {name: getattr(torch.Tensor, name) for name in READING_METHODS + ("__getitem__",)}
        self._functions = {name: getattr(torch, name) for name in READING_FUNCTIONS}
        self._inside = 0  # a read's own reads are not counted again
        self._last_cpu: int | None = None  # id of the tensor the last .cpu() returned: reading it is the same transfer

    def __len__(self) -> int:
        return len(self.readbacks)

    def _counted(self, kind: str, original, reads: Callable[..., bool] = lambda *args: True):
        """``original`` wrapped to count a readback whenever ``reads(*args)`` says the call reads values."""
        counter = self

        def read(*args, **kwargs):
            tensor = args[0] if args else None
            same_transfer = kind != "cpu" and tensor is not None and id(tensor) == counter._last_cpu
            if not counter._inside and not same_transfer and reads(*args):
                counter.readbacks.append(Readback(kind, asking_frame()))
            counter._last_cpu = None
            counter._inside += 1
            try:
                out = original(*args, **kwargs)
            finally:
                counter._inside -= 1
            if kind == "cpu":
                counter._last_cpu = id(out)
            return out

        return read

    def __enter__(self) -> "ReadbackCounter":
        COUNTING.append(self)
        for name in READING_METHODS:
            setattr(torch.Tensor, name, self._counted(name, self._methods[name]))
        torch.Tensor.__getitem__ = self._counted("boolean index", self._methods["__getitem__"], bool_index)
        for name in READING_FUNCTIONS:
            setattr(torch, name, self._counted(f"torch.{name}", self._functions[name]))
        return self

    def __exit__(self, *exc) -> None:
        COUNTING.remove(self)
        for name, original in self._methods.items():
            setattr(torch.Tensor, name, original)
        for name, original in self._functions.items():
            setattr(torch, name, original)

    def per_round(self) -> list[int]:
        """Readbacks of each round (from its start to the next's, the last's to the end of counting: the
        round, the host's choice of the next K, and after the last the batch's end)."""
        ends = [*self.round_starts[1:], len(self)]
        return [end - start for start, end in zip(self.round_starts, ends, strict=True)]

    def where(self) -> dict[str, int]:
        """How many readbacks each asking line made."""
        counts: dict[str, int] = {}
        for r in self.readbacks:
            counts[f"{r.where} ({r.kind})"] = counts.get(f"{r.where} ({r.kind})", 0) + 1
        return counts


def bool_index(tensor, index) -> bool:
    """Whether indexing with ``index`` takes a boolean mask (its result's size is the mask's count)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in parts)
