"""Per-shape matmul plans: for each weight shape and each row count a run will use, time the
ways of writing x W^T on this machine once, keep the fastest, cache the choice per machine.

The fastest way of writing a product is measured on each machine, not assumed, because it
depends on the CPU, the weight's shape and the row count, and the ways differ widely
(docs/lab_notes/code_measurements.md: matmul formulations). Every formulation computes the same
product (equal within rounding).
"""

import json
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from filelock import FileLock
from torch import nn
from tqdm.auto import tqdm

from specexp.output import short_hash


def _w_xt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (w @ x.T).T.contiguous()  # [m, out]; a GEMM with the weights as the left operand


def _w_xt_pad(x: torch.Tensor, w: torch.Tensor, multiple: int = 0) -> torch.Tensor:
    """Zero rows appended: one (``multiple`` 0), or up to a multiple of ``multiple``, because some BLAS
    kernels are faster for more rows than for fewer (docs/lab_notes/code_measurements.md: padding rows)."""
    m = x.shape[0]
    extra = -m % multiple if multiple else 1
    if extra == 0:
        return _w_xt(x, w)
    padded = torch.cat([x, x.new_zeros(extra, x.shape[1])])
    return (w @ padded.T).T[:m].contiguous()


# x [m, in], w [out, in] -> x w^T [m, out]. (`x @ w.T` is not among them: without a bias F.linear is
# that very call, aten::matmul on the transposed weight, so timing both only timed one kernel twice.)
FORMULATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "linear": lambda x, w: F.linear(x, w),
    "w_xt": _w_xt,
    "w_xt_pad": _w_xt_pad,
    "w_xt_pad4": partial(_w_xt_pad, multiple=4),
    "w_xt_pad16": partial(_w_xt_pad, multiple=16),
}
DEFAULT = "linear"  # rows outside the plan (long prompt passes: compute-bound, where F.linear's GEMM does well)


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "sve", "asimd")


def cpu_model() -> str:
    """The processor as /proc/cpuinfo names it, with family/model (a virtual machine may only say
    "AMD EPYC") and the vector extensions that decide which kernels are fast."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    name = fields.get("model name") or platform.processor() or platform.machine()
    family = (f" family {fields['cpu family']} model {fields['model']}"
              if "cpu family" in fields and "model" in fields else "")
    vector = ",".join(f for f in VECTOR_FLAGS if f in flags)
    return f"{name}{family}" + (f" [{vector}]" if vector else "")


def hardware_fingerprint(device: torch.device) -> dict:
    """What a plan's timings depend on: the processor (or GPU), threads, torch version."""
    fingerprint = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "device": device.type}
    if device.type == "cuda":
        fingerprint["gpu"] = torch.cuda.get_device_name(device)
    return fingerprint


def shape_key(weight: torch.Tensor) -> str:
    out_features, in_features = weight.shape
    return f"{out_features}x{in_features}:{str(weight.dtype).removeprefix('torch.')}"


PLAN_METHOD = "cold-weights-median-screened-v2"  # changes to how plans are measured invalidate cached plans
COLD_BYTES = 256 * 2**20  # more than any last-level cache: each timed call reads its weights from memory


def cold_copies(weight: torch.Tensor) -> list[torch.Tensor]:
    """Copies of ``weight`` that together exceed COLD_BYTES: a timed call that cycles through them reads
    its weights from memory, as in a model's forward (whose weights are far larger than the caches).
    Made once per shape for all its row counts (drawing them at random cost more than the timings)."""
    n_copies = max(2, min(256, -(-COLD_BYTES // (weight.numel() * weight.element_size()))))
    return [weight.detach().clone() for _ in range(n_copies)]


def time_formulations(weight: torch.Tensor, rows: int, repeats: int = 7, copies: list[torch.Tensor] | None = None,
                      screen: int = 2, margin: float = 1.25,
                      formulations: dict[str, Callable] = FORMULATIONS) -> dict[str, float]:
    """Median seconds of the formulations in the running for x [rows, in] against a weight of
    ``weight``'s shape, read cold (the calls cycle through ``copies``, default ``cold_copies(weight)``).
    The candidates take turns, so drift on a shared machine hits them alike. After ``screen`` turns a
    candidate whose fastest call took over ``margin`` times the best median is out (and not in the
    answer), because it could only win the final medians by a fluke and the slow candidates are where
    the time went (docs/lab_notes/code_measurements.md: screening formulations)."""
    g = torch.Generator(device=weight.device).manual_seed(0)
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device, generator=g)
    copies = copies or cold_copies(weight)
    n_copies = len(copies)
    sync = torch.cuda.synchronize if weight.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in formulations}
    calls = 0
    with torch.inference_mode():
        for fn in formulations.values():  # warm-up: first calls allocate and pick kernels
            fn(x, copies[0])
        for turn in range(repeats):
            if screen and turn == screen:
                best = min(statistics.median(ts) for ts in times.values())
                times = {name: ts for name, ts in times.items() if min(ts) <= margin * best}
            for name in times:
                w = copies[calls % n_copies]
                calls += 1
                sync()
                start = time.perf_counter()
                formulations[name](x, w)
                sync()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def planned_linear_forward(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` with the product written the way ``linear.matmul_plan`` chose for x's rows."""
    x2d = x.reshape(-1, linear.in_features)  # [m, in]
    y = FORMULATIONS[linear.matmul_plan.get(x2d.shape[0], DEFAULT)](x2d, linear.weight)  # [m, out]
    if linear.bias is not None:
        y = y + linear.bias
    return y.reshape(*x.shape[:-1], linear.out_features)


def plan_linear(linear: nn.Linear, choices: dict[int, str]) -> None:
    """Make this very module follow ``choices`` (rows -> formulation), added to any rows it was
    planned for before (a draft prepared later plans fewer rows). In place, so whatever holds
    a reference to it (a draft made of the target's layers, a lean forward) uses the plan too;
    its Parameters (tied weights) are untouched."""
    linear.matmul_plan = {**getattr(linear, "matmul_plan", {}), **choices}  # rows planned earlier keep their choice
    linear.forward = partial(planned_linear_forward, linear)


def linear_modules(model: nn.Module) -> list[nn.Linear]:
    """Every nn.Linear of the model, once each."""
    return [module for module in model.modules() if isinstance(module, nn.Linear)]


class MatmulPlans:
    """The plan file of one machine: {shape key: {rows: formulation}}, measured on demand."""

    def __init__(self, folder: Path, device: torch.device):
        self.fingerprint = hardware_fingerprint(device)
        keyed = {**self.fingerprint, "method": PLAN_METHOD, "formulations": sorted(FORMULATIONS)}
        self.path = Path(folder) / f"matmul-{short_hash(keyed)}.json"

    def _read(self) -> dict:
        if not self.path.exists():
            return {"fingerprint": self.fingerprint, "choices": {}, "timings": {}}
        return json.loads(self.path.read_text())

    def _write(self, plan: dict) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(plan, indent=1, sort_keys=True))
        tmp.replace(self.path)

    def choices_for(self, weights: Iterable[torch.Tensor], rows: Iterable[int]) -> dict[str, dict[int, str]]:
        """The plan for these weight shapes and row counts; what the file lacks is measured now
        (once per machine: the file is shared by every later run, under a lock)."""
        rows = sorted(set(rows))
        unique = {shape_key(w): w for w in weights}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            plan = self._read()
            missing = [(key, m) for key in unique for m in rows if str(m) not in plan["choices"].get(key, {})]
            if missing:
                copied = None  # missing is grouped by shape: one shape's copies held at a time
                for key, m in tqdm(missing, desc="timing matmul layouts (once per machine)", unit="shape"):
                    if key != copied:
                        copies, copied = cold_copies(unique[key]), key
                    timings = time_formulations(unique[key], m, copies=copies)
                    plan["choices"].setdefault(key, {})[str(m)] = min(timings, key=timings.get)
                    plan["timings"].setdefault(key, {})[str(m)] = timings
                self._write(plan)
        return {key: {m: plan["choices"][key][str(m)] for m in rows} for key in unique}

    def remembered(self, section: str, key: str, measure: Callable[[], object]) -> object:
        """``plan[section][key]``, measured by ``measure()`` the first time on this machine."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            plan = self._read()
            if key not in plan.get(section, {}):
                plan.setdefault(section, {})[key] = measure()
                self._write(plan)
        return plan[section][key]

    def int8_faster(self, weights: Iterable[torch.Tensor], rows: Iterable[int]) -> dict[str, bool]:
        """Per weight shape: whether int8 weights (`runtime/int8.py`) beat the best fp32
        formulation summed over these row counts; the int8 timings join the plan file."""
        rows = sorted(set(rows))
        unique = {shape_key(w): w for w in weights}
        self.choices_for(unique.values(), rows)  # the fp32 timings
        with FileLock(str(self.path) + ".lock"):
            plan = self._read()
            int8 = plan.setdefault("int8", {})
            missing = [(key, m) for key in unique for m in rows if str(m) not in int8.get(key, {})]
            for key, m in tqdm(missing, desc="timing int8 weights (once per machine)", unit="shape",
                               disable=not missing):
                int8.setdefault(key, {})[str(m)] = time_int8(unique[key], m)
            if missing:
                self._write(plan)
        return {key: (sum(int8[key][str(m)] for m in rows)
                      < sum(min(plan["timings"][key][str(m)].values()) for m in rows))
                for key in unique}


def time_int8(weight: torch.Tensor, rows: int, repeats: int = 7) -> float:
    """Median seconds of the int8 weight-only kernel for x [rows, in] against int8 weights of
    ``weight``'s shape, read cold like ``time_formulations``' (bf16 activations in, as the layer does)."""
    g = torch.Generator(device=weight.device).manual_seed(0)
    x = torch.randn(rows, weight.shape[1], generator=g, device=weight.device).to(torch.bfloat16)
    n_copies = max(2, min(256, -(-COLD_BYTES // weight.numel())))
    copies = [torch.randint(-127, 128, weight.shape, dtype=torch.int8, generator=g, device=weight.device)
              for _ in range(n_copies)]
    scales = torch.rand(weight.shape[0], generator=g, device=weight.device).to(torch.bfloat16)
    times = []
    with torch.inference_mode():
        torch.ops.aten._weight_int8pack_mm(x, copies[0], scales)
        for i in range(repeats):
            start = time.perf_counter()
            torch.ops.aten._weight_int8pack_mm(x, copies[i % n_copies], scales).float()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def apply_plan(models: nn.Module | Iterable[nn.Module], plans: MatmulPlans, rows: Iterable[int]) -> dict:
    """Write every Linear of the model(s) as the plan says for these row counts. Returns what was
    chosen, for the run's record: {shape key: {rows: formulation}} and the machine's fingerprint."""
    models = [models] if isinstance(models, nn.Module) else list(models)
    modules = [module for model in models for module in linear_modules(model)]
    choices = plans.choices_for((module.weight for module in modules), rows)
    for module in modules:
        plan_linear(module, choices[shape_key(module.weight)])
    return {"fingerprint": plans.fingerprint, "plan_file": str(plans.path), "choices": choices}
