"""Hardware profiles: what a target pass and a draft round cost on this machine.

`python -m specexp.profile [overrides]` (the same config groups as a study) measures, under the
study's runtime, batch size and sampling:
  - T(n, L): the target's pass over n = 1..N new tokens (forward + warp, as the engine times its
    `target_s`) at a few context lengths L, n taking turns so drift hits every n alike;
  - the engine's bookkeeping per round (verify, commit, rewind) and the prompt pass at each L;
  - per draft: seconds proposing K = 1..K_max tokens per round (and, for a draft that runs the
    target's pass itself, that pass), from short decodes of the study's first prompt.
A profile is JSON in the cache, one file per hardware fingerprint, target, dtype, runtime,
batch size and sampling; draft entries are added as studies with new drafts need them (jobs
sharing the cache take turns under a file lock). A study without one builds it first, with progress
(docs/lab_notes/code_measurements.md: building a profile). `specexp.costs.cost_model` prices rounds
with it; `python -m specexp.reprice` re-prices a finished sweep under another.
"""

import hashlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specexp.core.engine import device_sync, generate
from specexp.core.kv import new_ragged_kv
from specexp.core.metrics import position_counts, slot_counts
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.drafts.registry import K_KEYS
from specexp.errors import UserInputError
from specexp.output import short_hash, write_atomic
from specexp.paths import cache_root
from specexp.runtime import draft_models
from specexp.runtime.matmul import hardware_fingerprint

PROFILE_METHOD = "interleaved-median-v3"  # changes to how profiles are measured invalidate cached ones
DRAFT_METHOD = "lazy-fill-acceptance-v2"  # changes to how draft entries are measured re-measure those entries
CONTEXT_LENGTHS = (64, 256, 1024)
PROFILED_K = 8  # draft rounds and target passes are measured up to this K at least (figures draw K = 1..8)


def interpolate_k(k: np.ndarray, ks: list[int], seconds: list[float]) -> np.ndarray:
    """Seconds at k >= 1 (any shape) from those at the timed ks (1 always among them): linear between
    them, the last segment's slope past the largest."""
    if len(ks) == 1:
        return np.full(np.shape(k), float(seconds[0]))
    above = seconds[-1] + (seconds[-1] - seconds[-2]) / (ks[-1] - ks[-2]) * (k - ks[-1])
    return np.where(k > ks[-1], above, np.interp(k, ks, seconds))


def interpolate(x: float, xs: list[float], ys: np.ndarray) -> np.ndarray:
    """ys [len(xs), ...] at x: linear between the measured xs, extended along the nearest segment."""
    if len(xs) == 1:
        return np.asarray(ys[0])
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return (1 - w) * np.asarray(ys[i]) + w * np.asarray(ys[i + 1])


@dataclass
class Profile:
    key: dict  # what the timings depend on: fingerprint, target, dtype, runtime, batch size, sampling
    context_lengths: list[int]
    target_s: list[list[float]]  # [L][n-1]: T(n, L), seconds of a pass over n new tokens
    overhead_s: float  # per round: verify, commit, rewind
    prefill_s: list[float]  # [L]: the prompt pass over L tokens (with the first token's warp)
    # draft key -> {k, draft_s, reset_s, accepted, reached, method, weights[, pass_s]}
    drafts: dict[str, dict] = field(default_factory=dict)
    path: str | None = None

    @property
    def max_tokens(self) -> int:
        return len(self.target_s[0])

    def pass_s(self, n: int | np.ndarray, context: float, draft: str | None = None) -> np.ndarray:
        """T(n, L) for pass sizes n (any shape): interpolated in L, extended linearly past the largest
        n measured. A draft that runs the target's pass itself has its own (measured at one L)."""
        own = self.drafts.get(draft, {}).get("pass_s") if draft else None
        by_n = np.asarray(own) if own else interpolate(context, self.context_lengths, np.asarray(self.target_s))
        n = np.asarray(n)
        slope = by_n[-1] - by_n[-2] if len(by_n) > 1 else 0.0
        return np.where(n <= len(by_n), by_n[np.clip(n, 1, len(by_n)) - 1], by_n[-1] + slope * (n - len(by_n)))

    def prefill(self, length: float) -> float:
        return float(interpolate(length, self.context_lengths, np.asarray(self.prefill_s)))

    def draft_s(self, draft: str, k: int | np.ndarray) -> np.ndarray:
        """The draft's seconds per round asked for k tokens (0 at k = 0): linear between the K it was
        timed at (every K, or a few in a quick profile), extended along the last segment past them."""
        ks, seconds = self.drafts[draft]["k"], self.drafts[draft]["draft_s"]
        k = np.asarray(k)
        return np.where(k == 0, 0.0, interpolate_k(np.maximum(k, 1), ks, seconds))

    def reset_s(self, draft: str) -> float:
        """What a batch pays once for the draft when it proposes in that batch (a model draft's prompt pass)."""
        return float(self.drafts[draft]["reset_s"])

    def acceptance_counts(self, draft: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Per draft position, (accepted, reached) in the draft's profiling decodes; None for an
        entry measured before they were kept."""
        entry = self.drafts.get(draft, {})
        return (np.asarray(entry["accepted"]), np.asarray(entry["reached"])) if "reached" in entry else None

    def slot_counts(self, draft: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Per slot of a dynamic tree, (on the accepted path, in the tree) in the draft's profiling
        decodes; None for a chain draft."""
        entry = self.drafts.get(draft, {})
        return ((np.asarray(entry["slot_accepted"]), np.asarray(entry["slot_reached"]))
                if "slot_reached" in entry else None)

    def record(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "path"}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (json.dumps(self.record(), indent=1) + "\n").encode())
        self.path = str(path)

    @classmethod
    def load(cls, path: Path) -> "Profile":
        record = json.loads(Path(path).read_text())
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__}, path=str(path))


def profile_key(target, runtime_record: dict, batch_size: int, sampling: SamplingConfig, measurement: dict) -> dict:
    """What a profile's timings depend on (the runtime's settings, not its plan's details) and how
    they were measured (a quick profile is never taken for a careful one)."""
    runtime = {k: v for k, v in runtime_record.items() if k in ("name", "fuse_projections", "cache", "compile",
                                                                "compile_mode", "matmul_plan")}
    return {**hardware_fingerprint(target.model.device), "method": PROFILE_METHOD, "measurement": measurement,
            "target": target.name, "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch."),
            "runtime": runtime, "batch_size": batch_size, "sampling": asdict(sampling)}


def draft_key(draft_cfg: DictConfig) -> str:
    """A draft's entry: its config but K (every K is measured) and its card (what is said of it)."""
    plain = OmegaConf.to_container(draft_cfg, resolve=True)
    for name in (*K_KEYS, "card"):
        plain.pop(name, None)
    return f"{str(plain.get('_target_', '')).rsplit('.', 1)[-1]}-{short_hash(plain)}"


def weights_fingerprint(drafter) -> str:
    """A hash of the weights of the models the draft runs (`runtime.draft_models`), so a head
    retrained into the same folder is profiled again rather than priced with the old head's
    acceptance. Each parameter or buffer (int8 weights are buffers) contributes its name, shape,
    dtype and ~4k evenly strided values: cheap even for a draft that holds the target."""
    digest = hashlib.sha256()
    for i, model in enumerate(draft_models(drafter)):
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            flat = tensor.detach().flatten()
            sample = flat[:: max(1, flat.numel() // 4096)].to("cpu", torch.float64).numpy()
            digest.update(f"{i}.{name}{tuple(tensor.shape)}{tensor.dtype}".encode() + sample.tobytes())
    return digest.hexdigest()[:16]


def profile_path(key: dict) -> Path:
    return cache_root() / "profiles" / f"{short_hash(key)}.json"


def nondecreasing(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (least squares, pool-adjacent-violators): a pass over
    more tokens never costs less, so a dip between medians is noise, not a shape to plan for."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop(-1)
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [mean for mean, count in blocks for _ in range(count)]


@torch.inference_mode()
def measure_target(forward, batch_size: int, max_tokens: int, context_lengths: list[int], sampling: SamplingConfig,
                   repeats: int = 15, progress: tqdm | None = None) -> tuple[list[list[float]], list[float]]:
    """T(n, L) [L][n-1] (medians over ``repeats`` turns of n = 1..max_tokens, after one that warms
    up; made non-decreasing in n) and the prompt pass at each L (a third as many times)."""
    device = forward.device
    sync = device_sync(device)  # each pass is timed alone, to its end on the device
    vocab_size = forward.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    target_s, prefill_s = [], []
    for length in context_lengths:
        ids = torch.randint(vocab_size, (batch_size, length + max_tokens), generator=generator).to(device)
        mask = torch.ones(batch_size, length, dtype=torch.long, device=device)
        kv = new_ragged_kv(forward, batch_size, device, capacity=length + max_tokens)
        prompt_times = []
        turns = max(2, repeats // 3) + 1
        for turn in range(turns):
            sync()
            start = time.perf_counter()
            logits_to_probs(kv.forward(forward, ids[:, :length], mask, logits_to_keep=1), sampling)
            sync()
            prompt_times.append(time.perf_counter() - start)
            if turn < turns - 1:  # the last one stays: the context every pass below attends to
                kv.drop_last(torch.full((batch_size,), length, device=device))
        times = {n: [] for n in range(1, max_tokens + 1)}
        for repeat in range(repeats + 1):
            for n in range(1, max_tokens + 1):
                start = time.perf_counter()
                logits_to_probs(kv.forward(forward, ids[:, length : length + n], logits_to_keep=n), sampling)
                sync()
                if repeat:
                    times[n].append(time.perf_counter() - start)
                kv.drop_last(torch.full((batch_size,), n, device=device))
            if progress is not None:
                progress.update(1)
        target_s.append(nondecreasing([statistics.median(times[n]) for n in times]))
        prefill_s.append(statistics.median(prompt_times[1:]))
    return target_s, prefill_s


def _decode(forward, prompt: list[int], batch_size: int, drafter, sampling, new_tokens: int, target,
            k: int | None = None):
    """A decode of ``batch_size`` copies of the prompt asking the draft for ``k`` tokens a round (None: its k_max)."""
    generator = torch.Generator(device=target.model.device).manual_seed(0)
    return generate(forward, [prompt] * batch_size, drafter, sampling, new_tokens, target.eos_token_ids, generator,
                    target.pad_token_id, k_max=k)


def measure_overhead(forward, target, prompt: list[int], batch_size: int, sampling,
                     new_tokens: int = 32) -> tuple[float, float]:
    """The engine's seconds per AR round outside the target pass (verify, commit, rewind) and the
    whole prompt pass as the engine times it."""
    _decode(forward, prompt, batch_size, None, sampling, 4, target)  # warm-up
    out = _decode(forward, prompt, batch_size, None, sampling, new_tokens, target)
    return statistics.median(np.add(out.draft_s, out.verify_s)), out.prefill_s


def tree_slot_counts(out, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """A decode's (accepted, reached) per tree slot 0..n_slots-1 (k_policy/tree.py), summed over its rounds."""
    accepted, reached = np.zeros(n_slots), np.zeros(n_slots)
    for proposed, path, active in zip(out.n_proposed.numpy(), out.paths, out.active.numpy(), strict=True):
        looked, took = slot_counts(proposed, path.numpy(), active, n_slots)
        reached, accepted = reached + looked, accepted + took
    return accepted, reached


def acceptance_counts(out, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """A decode's (accepted, reached) per draft position 1..k_max, summed over its rounds and rows."""
    reached, took = position_counts(out.n_proposed.flatten().numpy(), out.n_accepted.flatten().numpy(),
                                    out.active.flatten().numpy(), k_max)
    return took.sum(0), reached.sum(0)


def measure_draft(forward, target, drafter, prompt: list[int], batch_size: int, sampling, ks: list[int],
                  ar_prefill_s: float, new_tokens: int = 32, progress: tqdm | None = None) -> dict:
    """A draft's median seconds per round asked for each k (the rounds of short decodes of a real
    prompt, so catching up on accepted tokens is counted as it happens); what a batch pays once for
    it (its reset at the prompt pass and the excess of its first round, where a model draft fills
    its cache); its acceptance per position in those decodes (where draft.k=auto starts from); and
    for a draft that runs the target's pass itself, that pass by size."""
    draft_s, once, passes = [], [], {}
    accepted, reached = np.zeros(max(ks)), np.zeros(max(ks))
    tree = drafter.traits.grows_trees  # draft.k=auto starts a tree's node budget from its slot counts
    slot_accepted, slot_reached = np.zeros(max(ks)), np.zeros(max(ks))
    _decode(forward, prompt, batch_size, drafter, sampling, 4, target)  # warm-up
    for k in ks:
        out = _decode(forward, prompt, batch_size, drafter, sampling, new_tokens, target, k)
        draft_s.append(statistics.median(out.draft_s))
        once.append(out.prefill_s - ar_prefill_s + (out.draft_s[0] - draft_s[-1] if out.draft_s else 0.0))
        took, looked = acceptance_counts(out, max(ks))
        accepted, reached = accepted + took, reached + looked
        if tree:
            took, looked = tree_slot_counts(out, max(ks))
            slot_accepted, slot_reached = slot_accepted + took, slot_reached + looked
        for n, seconds in zip(out.n_proposed.max(1).values.tolist(), out.target_s, strict=True):
            passes.setdefault(n + 1, []).append(seconds)
        if progress is not None:
            progress.update(1)
    entry = {"k": list(ks), "draft_s": draft_s, "reset_s": max(statistics.median(once), 0.0),
             "accepted": accepted.tolist(), "reached": reached.tolist(), "method": DRAFT_METHOD}
    if tree:
        entry |= {"slot_accepted": slot_accepted.tolist(), "slot_reached": slot_reached.tolist()}
    if drafter.traits.shares_target_pass:
        entry["pass_s"] = fill_by_size({n: statistics.median(s) for n, s in passes.items()}, max(ks) + 1)
    return entry


def fill_by_size(measured: dict[int, float], n_max: int) -> list[float]:
    """Seconds by pass size 1..n_max from the sizes seen (linear between them, flat past the ends)."""
    sizes = sorted(measured)
    return list(np.interp(np.arange(1, n_max + 1), sizes, [measured[n] for n in sizes]))


def load_profile(path: str | Path, draft: str | None = None) -> Profile:
    """A profile file given by hand (``profile.path``); it must price the study's draft."""
    if not Path(path).is_file():
        raise UserInputError(f"profile.path='{path}' is not a file; give a profile JSON (python -m specexp.profile "
                             "writes one) or profile.path=null for this machine's")
    profile = Profile.load(Path(path))
    if draft is not None and draft not in profile.drafts:
        raise UserInputError(f"the profile '{path}' has no entry for this draft ({draft}); it prices: "
                             f"{', '.join(profile.drafts) or 'no draft'}")
    return profile


def ensure_profile(target, forward, runtime_record: dict, drafter, draft_name: str, prompt: list[int], batch_size: int,
                   sampling: SamplingConfig, k_max: int, context_lengths: list[int] = CONTEXT_LENGTHS,
                   repeats: int = 15, new_tokens: int = 32, draft_ks: list[int] | None = None,
                   force: bool = False) -> Profile:
    """The profile of this machine and setting, with an entry for this draft: loaded from the cache,
    or measured (with progress) and cached first. ``draft_ks``: the K a draft's rounds are timed at
    (None: every K; the others are interpolated)."""
    measurement = {"context_lengths": list(context_lengths), "repeats": repeats, "new_tokens": new_tokens}
    if draft_ks is not None:  # a profile timed at fewer K is never taken for one timed at every K
        measurement["draft_ks"] = sorted(draft_ks)
    key = profile_key(target, runtime_record, batch_size, sampling, measurement)
    path = profile_path(key)
    max_tokens = max(k_max, PROFILED_K) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    # Processes sharing the cache (parallel sweep jobs) take turns: each reads the entries the one
    # before it saved, and none times a pass while another measures.
    with FileLock(str(path) + ".lock"):
        profile = None if force or not path.exists() else Profile.load(path)
        if profile is not None and profile.max_tokens < max_tokens:
            profile = None  # this study passes more tokens than the cached profile measured
        context = target.context_length or max(context_lengths) + max_tokens
        lengths = ([length for length in context_lengths if length + max_tokens <= context]
                   or [max(context - max_tokens, 1)])
        ks = timed_ks(max_tokens - 1, drafter.traits.k_limit if drafter is not None else None, draft_ks)
        entry = {} if profile is None else profile.drafts.get(draft_name, {})
        weights = None if drafter is None else weights_fingerprint(drafter)
        need_draft = drafter is not None and (not set(ks) <= set(entry.get("k", []))
                                              or entry.get("method") != DRAFT_METHOD
                                              or entry.get("weights") != weights
                                              or (drafter.traits.grows_trees and "slot_reached" not in entry))
        steps = (0 if profile is not None else len(lengths) * (repeats + 1) + 1) + (len(ks) if need_draft else 0)
        if steps == 0:
            return profile
        with tqdm(total=steps, desc="hardware profile", unit="step", dynamic_ncols=True, file=sys.stderr) as progress:
            if profile is None:
                target_s, prefill_s = measure_target(forward, batch_size, max_tokens, lengths, sampling, repeats,
                                                     progress)
                overhead_s, _ = measure_overhead(forward, target, prompt, batch_size, sampling, new_tokens)
                progress.update(1)
                profile = Profile(key, lengths, target_s, overhead_s, prefill_s)
            if need_draft:
                _, ar_prefill_s = measure_overhead(forward, target, prompt, batch_size, sampling, new_tokens=2)
                profile.drafts[draft_name] = measure_draft(forward, target, drafter, prompt, batch_size, sampling, ks,
                                                           ar_prefill_s, new_tokens, progress) | {"weights": weights}
        profile.save(path)
        return profile


def timed_ks(k_max: int, k_limit: int | None, draft_ks: list[int] | None) -> list[int]:
    """The K a draft's rounds are timed at: 1..k_max (at most its k_limit, Medusa's chain), or those
    of ``draft_ks`` below that with 1 and the largest always in (nothing past them is extrapolated)."""
    top = min(k_max, k_limit) if k_limit else k_max
    if draft_ks is None:
        return list(range(1, top + 1))
    if any(k < 1 for k in draft_ks):
        raise UserInputError(f"profile.draft_ks={list(draft_ks)} is not allowed; give K >= 1, or null for every K")
    return sorted({1, top} | {k for k in draft_ks if k < top})


def describe(profile: Profile) -> str:
    """The profile as a few lines of text: T(n)/T(1) at each context length, then each draft."""
    lines = [f"{profile.key['target']} on {profile.key['cpu']}"
             + (f" / {profile.key['gpu']}" if "gpu" in profile.key else "")
             + f", batch {profile.key['batch_size']}, runtime {profile.key['runtime'].get('name')}",
             f"bookkeeping per round {profile.overhead_s * 1e3:.2f} ms"]
    for length, seconds, prefill in zip(profile.context_lengths, profile.target_s, profile.prefill_s, strict=True):
        ratios = " ".join(f"{s / seconds[0]:.2f}" for s in seconds)
        lines.append(f"L={length}: T(1) {seconds[0] * 1e3:.2f} ms, T(n)/T(1) n=1..{len(seconds)}: {ratios}; "
                     f"prompt pass {prefill * 1e3:.1f} ms")
    for name, entry in profile.drafts.items():
        per_k = " ".join(f"{s * 1e3:.2f}" for s in entry["draft_s"])
        lines.append(f"draft {name}: ms per round for k={','.join(map(str, entry['k']))}: {per_k}; "
                     f"reset {entry['reset_s'] * 1e3:.1f} ms")
    return "\n".join(lines)
