"""Helpers shared by the benchmark scripts: one decode through our engine, one through HF."""

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from specexp.core.engine import GenerationOutput, generate
from specexp.core.sampling import SamplingConfig
from specexp.data import Prompt
from specexp.models import LoadedModel
from specexp.runtime.matmul import cpu_model
from specexp.study.run import batch_record, round_table
from specexp.study.summary import RunFacts, summarize

GREEDY = SamplingConfig()


def decode_ours(target: LoadedModel, ids: list[int], drafter, max_new: int, forward=None) -> GenerationOutput:
    """Greedy through our engine; ``forward``: the target's forward under a runtime (default: the model)."""
    return generate(forward or target.model, [ids], drafter, GREEDY, max_new, target.eos_token_ids,
                    torch.Generator().manual_seed(0), target.pad_token_id)


@torch.inference_mode()
def decode_hf(target: LoadedModel, ids: list[int], max_new: int, **kwargs) -> tuple[list[int], float]:
    """HF generate(), greedy; returns the new tokens (EOS kept, like our engine) and seconds."""
    x = torch.tensor([ids])
    start = time.perf_counter()
    out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                                pad_token_id=target.pad_token_id, **kwargs)
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def stream_bandwidth(n_bytes: int, repeats: int = 7) -> float:
    """Bytes/s of a sum over n_bytes of fp32 (each byte read once)."""
    x = torch.ones(n_bytes // 4)
    x.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return n_bytes / statistics.median(times)


def machine() -> str:
    return (f"{cpu_model()} ({platform.machine()}), {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}, "
            f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}")


def decode_arguments(parser: argparse.ArgumentParser, default_out: Path) -> argparse.ArgumentParser:
    """The options of a benchmark that decodes prompt sets: --prompts, --max-new-tokens, --out."""
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=default_out)
    return parser


def report_header(title: str) -> list[str]:
    """A record's first lines: its title and date, the machine, and the command that wrote it."""
    command = " ".join(["python", *sys.argv])  # the script as it was typed, and its options
    return [f"# {title} ({datetime.date.today()})", "", f"Machine: {machine()}", "", f"Written by: `{command}`", ""]


def write_report(path: Path, lines: list[str]) -> None:
    """The markdown report written to ``path`` and printed, then where it went (a JSON line)."""
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    print(text)
    print(json.dumps({"written": str(path)}))


def interleaved_summaries(target: LoadedModel, prompts: list[Prompt], encoded: list[list[int]], methods: dict,
                          sampling: SamplingConfig, max_new: int, seed: int, desc: str = "",
                          forward=None, profile=None) -> dict[str, dict]:
    """Decode every prompt with every method back to back, the order rotating per prompt so drift
    on a shared machine hits all alike, after one short untimed decode of each method. ``methods``:
    name -> (drafter or None, K[, K policy[, the draft's profile entry]]), with "ar" (the baseline,
    drafter None) first. Returns per non-AR method the study's own `summarize` metrics (priced by
    ``profile`` where an entry is named), plus the median per-prompt speedup and the number of
    prompts decoded identically to AR."""
    names = list(methods)
    methods = {name: (*spec, None, None)[:4] for name, spec in methods.items()}
    rounds, batches, tokens = {m: [] for m in names}, {m: [] for m in names}, {m: {} for m in names}
    for drafter, _, policy, _ in methods.values():  # warm-up: each method's one-time costs paid untimed
        generate(forward or target.model, [encoded[0]], drafter, sampling, 4, target.eos_token_ids,
                 torch.Generator().manual_seed(seed), target.pad_token_id, k_policy=policy)
    for i, (prompt, ids) in enumerate(tqdm(list(zip(prompts, encoded, strict=True)), desc=desc)):
        for name in names[i % len(names):] + names[: i % len(names)]:
            drafter, k, policy, _ = methods[name]
            out = generate(forward or target.model, [ids], drafter, sampling, max_new, target.eos_token_ids,
                           torch.Generator().manual_seed(seed + i), target.pad_token_id, k_policy=policy)
            mode = "ar" if drafter is None else "spec"
            rounds[name].append(round_table(out, [prompt], mode, i, k))
            batches[name].append(batch_record(out, mode, i, prompt.category, len(ids)))
            tokens[name][prompt.id] = (out.tokens[0], out.total_s)
    ar_rounds, ar_batches = pd.concat(rounds["ar"]), pd.DataFrame(batches["ar"])
    results = {}
    for name in names[1:]:
        _, k, _, draft = methods[name]
        summary = summarize(pd.concat([ar_rounds, *rounds[name]], ignore_index=True),
                            pd.concat([ar_batches, pd.DataFrame(batches[name])], ignore_index=True).assign(repeat=0),
                            RunFacts(k, profile=profile if draft else None, draft_profile=draft or "")).to_dict()
        ratios = [len(tokens[name][p][0]) / tokens[name][p][1] / (len(tokens["ar"][p][0]) / tokens["ar"][p][1])
                  for p in tokens[name]]
        summary["median_prompt_speedup"] = statistics.median(ratios)
        summary["identical"] = sum(tokens[name][p][0] == tokens["ar"][p][0] for p in tokens[name])
        results[name] = summary
    return results


def study_draft(target: LoadedModel, forward, runtime_record: dict, name: str, prompt: list[int],
                overrides: tuple[str, ...] = (), sampling: SamplingConfig = GREEDY):
    """A draft config built as `python -m specexp draft=NAME OVERRIDES` builds it: (drafter, K, its K
    policy or None, its entry in this machine's profile, the profile), the draft's own models
    prepared by the config's runtime and then the profile measured if this machine has none for
    the setting (a draft profiled before its runtime plan ran at half speed: target_prefix)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from specexp.costs.hardware_profile import PROFILED_K, draft_key, ensure_profile
    from specexp.drafts.build import resolve_draft_k
    from specexp.k_policy import make_policy
    from specexp.paths import CONFIG_DIR
    from specexp.runtime import round_rows

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[f"draft={name}", *overrides])
    draft_cfg, policy_name = resolve_draft_k(cfg.draft)
    drafter = instantiate(draft_cfg)(target)
    k_max = drafter.traits.k_max
    instantiate(cfg.runtime).prepare(target, drafter, round_rows(1, max(k_max, PROFILED_K)))  # as a study does
    key = draft_key(draft_cfg)
    profile = ensure_profile(target, forward, runtime_record, drafter, key, prompt, 1, sampling, k_max,
                             list(cfg.profile.context_lengths), cfg.profile.repeats, cfg.profile.new_tokens)
    return drafter, k_max, make_policy(policy_name, profile, key, drafter), key, profile
