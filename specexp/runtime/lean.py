"""runtime=lean: the target (and every Llama-shaped model draft) runs through its lean decoder over a static
ragged cache, with q/k/v and gate/up fused where that makes the timed pass faster on this machine, and with
runtime.compile=true every step compiled (runtime/compiled.py)."""

import logging
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from specexp.core.interface import Drafter
from specexp.core.kv import StaticRaggedKV
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.paths import cache_root
from specexp.runtime import COMPILE_BACKENDS, HFRuntime, PreparedRuntime
from specexp.runtime.compiled import StepCompiler
from specexp.runtime.decoder import LeanDecoder, existing_decoder, lean_decoder, unsupported_reason
from specexp.runtime.matmul import MatmulPlans, shape_key

log = logging.getLogger(__name__)


@dataclass
class LeanRuntime(HFRuntime):
    """runtime=lean: the target runs through its lean decoder over a static ragged cache
    (``fuse_projections``: one GEMM for q/k/v and one for gate/up). A target the lean forward
    cannot run (another architecture) runs through transformers' forward, with a warning and the
    reason in the record."""

    fuse_projections: bool | str = "auto"  # auto: fused or separate, whichever makes the timed pass faster
    compile: bool = False  # the target's and the draft's steps compiled (runtime/compiled.py)
    compile_mode: str | None = None  # torch.compile's mode; None: reduce-overhead (CUDA graphs) on CUDA, default on CPU
    compile_backend: str = "inductor"  # torch.compile's backend (eager: the capture alone, no code generated)
    compile_max_tokens: int = 32  # passes over more new tokens (prompts) run eagerly
    compiler: StepCompiler | None = field(default=None, init=False, repr=False)  # made by target_forward

    def __post_init__(self):
        super().__post_init__()
        if self.fuse_projections not in (True, False, "auto"):
            raise UserInputError(f"runtime.fuse_projections={self.fuse_projections} is not allowed; "
                                 f"use true, false or auto")
        if self.compile_backend not in COMPILE_BACKENDS:
            raise UserInputError(f"runtime.compile_backend={self.compile_backend} is not allowed; choose one of "
                                 f"{', '.join(COMPILE_BACKENDS)}")
        if self.compile_max_tokens < 1:
            raise UserInputError(f"runtime.compile_max_tokens={self.compile_max_tokens} is not allowed; "
                                 f"it must be >= 1")

    def prepare(self, target: LoadedModel, drafter: Drafter | None, rows: Iterable[int]) -> PreparedRuntime:
        """As runtime=hf's, then (fuse_projections=auto) fused or separate projections, whichever
        makes the planned pass faster on this machine."""
        prepared = super().prepare(target, drafter, rows)
        decoder = existing_decoder(target.model)
        if prepared.record["name"] == "lean" and self.fuse_projections == "auto":
            planned = sorted(m for m in set(rows) if m <= self.max_planned_rows) or [1]
            key = f"{fusion_key(decoder)}:rows={','.join(map(str, planned))}"
            plans = MatmulPlans(cache_root() / "plans", decoder.device)
            if not plans.remembered("fusion", key, lambda: fusion_pays(decoder, planned)):  # once per machine
                decoder.unfuse()
            prepared.record["fuse_projections"] = decoder.fused
        if prepared.record.get("compile"):  # target_forward compiled the lean decoder; the draft's steps alike
            prepared.compiled, prepared.compiler = prepared.forward, self.compiler
            if drafter is not None and drafter.traits.models:  # core.interface.RunsModels
                drafter.compile_steps(self.compiler)
        return prepared

    def target_forward(self, target: LoadedModel) -> tuple[Callable, dict]:
        reason = unsupported_reason(target.model)
        if reason is not None:
            log.warning("runtime=lean cannot run %s (%s); its target runs through transformers' forward",
                        target.name, reason)
            return target.model, {"name": "hf", "requested": "lean", "fallback_reason": reason}
        decoder = lean_decoder(target.model, self.fuse_projections in (True, "auto"))  # auto: decided in prepare
        if self.fuse_projections is False:
            decoder.unfuse()  # the projections keep their weights (views); a shared early exit may have fused them
        record = {"name": "lean", "fuse_projections": decoder.fused, "fuse_setting": self.fuse_projections,
                  "cache": "static", "compile": self.compile}
        if not self.compile:
            return decoder, record
        mode = self.compile_mode or ("reduce-overhead" if decoder.device.type == "cuda" else "default")
        record |= {"compile_mode": mode, "compile_backend": self.compile_backend,
                   "compile_max_tokens": self.compile_max_tokens}
        self.compiler = StepCompiler(mode, self.compile_max_tokens, self.compile_backend)  # one per prepared run
        return self.compiler.decoder(decoder, "target"), record


def fusion_key(decoder: LeanDecoder) -> str:
    """What fusion_pays' answer depends on besides the machine: the layers' fusable shapes."""
    w = decoder.layers[0]
    shapes = [shape_key(m.weight) for m in (w.qkv, w.gate_up) if isinstance(m, nn.Linear)]
    return f"{decoder.n_layers}x[{','.join(shapes)}]"


@torch.inference_mode()
def fusion_pays(decoder: LeanDecoder, rows: list[int], repeats: int = 5,
                clock: Callable[[], float] = time.perf_counter) -> bool:
    """Whether the decoder's pass is faster with one GEMM for q/k/v and one for gate/up than with
    the separate products, timed in context: a pass over each row count's tokens after a 32-token
    prompt, fused and separate taking turns, medians summed. It is timed in context because per-shape
    timings in isolation are too close and too noisy to decide it (docs/lab_notes/code_measurements.md:
    fusion timed in context)."""
    if not decoder.fused:
        return False  # nothing was fusable (int8 and fp32 projections mixed)
    vocab_size = decoder.config.get_text_config().vocab_size
    prompt = torch.arange(32, device=decoder.device)[None] % vocab_size  # [1, 32]
    kv = StaticRaggedKV.for_model(decoder, 1, capacity=32 + max(rows), device=decoder.device)
    kv.forward(decoder, prompt)
    fused = [(w.qkv, w.gate_up) for w in decoder.layers]
    seconds = {True: {m: [] for m in rows}, False: {m: [] for m in rows}}
    for repeat in range(repeats + 1):  # the first round warms up
        for m in rows:
            for state in (True, False):
                for w, (qkv, gate_up) in zip(decoder.layers, fused, strict=True):
                    w.qkv, w.gate_up = (qkv, gate_up) if state else (None, None)
                x = torch.arange(32, 32 + m, device=decoder.device)[None] % vocab_size
                start = clock()
                kv.forward(decoder, x, logits_to_keep=m)
                if repeat:
                    seconds[state][m].append(clock() - start)
                kv.drop_last(torch.tensor([m], device=decoder.device))
    for w, (qkv, gate_up) in zip(decoder.layers, fused, strict=True):
        w.qkv, w.gate_up = qkv, gate_up
    total = {state: sum(statistics.median(seconds[state][m]) for m in rows) for state in seconds}
    return total[True] <= total[False]
