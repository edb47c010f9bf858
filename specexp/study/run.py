"""One run of a study: wire config -> models, draft, prompts -> engine -> metrics -> results.

Every input is checked before anything is written. The AR baseline and the speculative run
decode the same batches in the same process, interleaved batch by batch (their order
alternating) so that drift in machine speed hits both alike.
"""

import copy
import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specexp.core.engine import GenerationOutput, generate
from specexp.core.interface import Drafter
from specexp.core.k_policy import KPolicy
from specexp.core.sampling import SamplingConfig
from specexp.costs.hardware_profile import PROFILED_K, Profile, draft_key, ensure_profile, load_profile
from specexp.data import Prompt, encode_prompts
from specexp.drafts.build import build_draft
from specexp.errors import UserInputError
from specexp.k_policy import make_policy
from specexp.models import LoadedModel
from specexp.runtime import round_rows
from specexp.runtime.compiled import CompiledDecoder, StepCompiler, full_pass
from specexp.study import intervals, timing
from specexp.study.checks import check_study_config
from specexp.study.divergence import divergence, divergence_line
from specexp.study.references import greedy_continuations
from specexp.study.results import JobResults
from specexp.study.summary import RunFacts, summarize
from specexp.study.timing import TimingSettings

WARMUP_TOKENS = 8  # per arm, on the first batch, before anything is timed


@dataclass
class Study:
    target: LoadedModel
    drafter: Drafter
    k_max: int  # most draft tokens a round asks: the draft's traits.k_max, 0 for draft.k=0 (never asked)
    prompts: list[Prompt]
    encoded: list[list[int]]
    sampling: SamplingConfig
    max_new_tokens: int
    batch_size: int
    batch_by_category: bool
    seed: int
    forward: Callable  # the target's forward under the runtime (its lean decoder, or the model)
    runtime: dict  # the runtime's settings and matmul plan, recorded in summary.json
    compiled: CompiledDecoder | None = None  # runtime.compile=true: `forward`, compiled (PreparedRuntime.compiled)
    compiler: StepCompiler | None = None  # runtime.compile=true: what compiled the target's and the draft's steps
    profile: Profile | None = None  # this machine's costs, which the cost model prices rounds with
    draft_profile: str = ""  # the draft's entry in the profile (costs/hardware_profile.draft_key)
    draft_name: str = ""  # the draft's config name (distilled, target_prefix): summary["draft"]
    k_policy: KPolicy | None = None  # draft.k=auto / heuristic; None: K fixed
    k_setting: str = "fixed"  # fixed, auto or heuristic
    timing: TimingSettings = field(default_factory=TimingSettings)  # how long the arms are timed
    clock: Callable[[], float] = time.perf_counter  # what both arms are timed with (tests inject a fake one)


def prepare(cfg: DictConfig, force_profile: bool = False) -> Study:
    """Build and check everything a run needs; raises UserInputError on bad input.
    ``force_profile``: measure this machine's hardware profile again even if one is cached."""
    check_study_config(cfg)
    sampling = instantiate(cfg.sampling)
    prompts = instantiate(cfg.data)
    if not prompts:
        raise UserInputError(f"the prompt set '{cfg.data.get('_target_')}' is empty; "
                             f"give a set with at least one prompt")
    target = instantiate(cfg.target)
    if target.tokenizer is None:
        raise UserInputError(f"target '{target.name}' has no tokenizer; a study needs one to encode its prompts")
    built = build_draft(cfg.draft, target)
    drafter = built.drafter
    runtime = instantiate(cfg.runtime).prepare(target, drafter, planned_rows(cfg, built.k_max))
    encoded = encode_prompts(target.tokenizer, prompts, chat_template=cfg.chat_template)
    context = target.context_length
    for prompt, ids in zip(prompts, encoded, strict=False):
        if not ids:
            raise UserInputError(f"prompt '{prompt.id}' encodes to no tokens")
        if context is not None and len(ids) + cfg.max_new_tokens > context:
            raise UserInputError(
                f"prompt '{prompt.id}' has {len(ids)} tokens; with max_new_tokens={cfg.max_new_tokens} "
                f"it exceeds the target's context of {context} tokens"
            )
    study = Study(target, drafter, built.k_max, prompts, encoded, sampling, cfg.max_new_tokens, cfg.batch_size,
                  cfg.batch_by_category, cfg.seed, runtime.forward, runtime.record,
                  draft_profile=draft_key(built.config), draft_name=built.name, compiled=runtime.compiled,
                  compiler=runtime.compiler, timing=TimingSettings(**cfg.timing))
    if drafter.traits.greedy_only and not sampling.greedy:
        raise UserInputError(f"draft={type(drafter).__name__} needs greedy decoding; set sampling=greedy "
                             f"(got temperature={sampling.temperature})")
    if drafter.traits.needs_reference:  # the oracle: the target's greedy continuations, decoded untimed
        new_tokens = max(cfg.max_new_tokens, cfg.profile.new_tokens)
        drafter.set_reference(encoded, greedy_continuations(runtime.forward, target, encoded, new_tokens,
                                                            cfg.batch_size))
    study.profile = study_profile(cfg, study, force_profile)
    study.k_policy = make_policy(built.policy, study.profile, study.draft_profile, drafter)
    study.k_setting = built.policy or "fixed"
    return study


def planned_rows(cfg: DictConfig, k_max: int) -> list[int]:
    """The row counts the matmul plan covers: this run's target passes (K up to k_max) and, where the
    run may measure a profile, every pass a profile times (K up to PROFILED_K), so the profile holds
    for any K a study runs. (Each row count new to the plan takes seconds to time.)"""
    return round_rows(cfg.batch_size, max(k_max, PROFILED_K) if measures_profile(cfg.profile) else k_max)


def measures_profile(settings: DictConfig) -> bool:
    """Whether a run prices with this machine's profile, measured where the cache lacks it (not with
    the file at ``profile.path``, nor unpriced with ``profile.enabled=false``)."""
    return settings.enabled and settings.path is None


def study_profile(cfg: DictConfig, study: Study, force: bool = False) -> Profile | None:
    """The hardware profile the run is priced with (``profile.path``, or this machine's from the
    cache, measured first when missing), with an entry for the study's draft."""
    settings = cfg.profile
    if settings.path is not None:
        return load_profile(settings.path, study.draft_profile if study.k_max > 0 else None)
    if not measures_profile(settings):
        return None
    drafter = study.drafter if study.k_max > 0 else None  # a draft never asked needs no entry
    return ensure_profile(study.target, study.forward, study.runtime, drafter, study.draft_profile,
                          study.encoded[0], study.batch_size, study.sampling, study.k_max,
                          context_lengths=list(settings.context_lengths), repeats=settings.repeats,
                          new_tokens=settings.new_tokens, draft_ks=settings.get("draft_ks"), force=force)


def make_batches(prompts: list[Prompt], batch_size: int, by_category: bool = True) -> list[list[int]]:
    """Prompt indices in batches; by_category keeps categories apart, so per-category timings are exact."""
    if not by_category:
        return [list(range(s, min(s + batch_size, len(prompts)))) for s in range(0, len(prompts), batch_size)]
    order = sorted(range(len(prompts)), key=lambda i: (prompts[i].category or "", i))
    batches = []
    for _, group in groupby(order, key=lambda i: prompts[i].category):
        group = list(group)
        batches += [group[s : s + batch_size] for s in range(0, len(group), batch_size)]
    return batches


def round_table(out: GenerationOutput, prompts: list[Prompt], mode: str, batch: int, k: int) -> pd.DataFrame:
    """One row per (prompt, round) in which the prompt was still generating."""
    r, b = np.nonzero(out.active.numpy())
    return pd.DataFrame({
        "mode": mode,
        "batch": batch,
        "prompt_id": [prompts[i].id for i in b],
        "category": [prompts[i].category for i in b],
        "round": r,
        "k": k,  # configured K (its largest under draft.k=auto)
        "k_chosen": np.asarray(out.k_chosen, dtype=int)[r] if out.k_chosen else 0,  # K asked of the draft that round
        "k_round": out.n_proposed.max(1).values.numpy()[r],  # tokens the target verified that round
        "context": np.asarray(out.context, dtype=int)[r] if out.context else 0,  # committed tokens of the longest row
        "proposed": out.n_proposed.numpy()[r, b],  # a tree's nodes
        "depth": out.depth.numpy()[r, b],  # the proposal's depth (a chain's: proposed)
        "accepted": out.n_accepted.numpy()[r, b],
        "emitted": out.n_emitted.numpy()[r, b],
        "group": out.group.numpy()[r, b] if out.group is not None else 0,  # prompt lookup: the match length
        "draft_s": np.asarray(out.draft_s)[r],  # per round, shared by the rows of a batch
        "reencode_s": np.asarray(out.reencode_s, dtype=float)[r],  # of draft_s: re-encoding text between tokenizers
        "target_s": np.asarray(out.target_s)[r],
        "verify_s": np.asarray(out.verify_s)[r],
    })


def batch_record(out: GenerationOutput, mode: str, batch: int, category: str | None, prompt_length: int) -> dict:
    return {"mode": mode, "batch": batch, "category": category, "tokens": sum(len(t) for t in out.tokens),
            "total_s": out.total_s, "prefill_s": out.prefill_s, "prompt_length": prompt_length}


def _add_divergences(study: Study, indices: list[int], answers: list[dict]) -> None:
    """Each answer whose greedy arms differ gets its first divergence (one untimed eager pass)."""
    forward = study.forward if study.compiled is None else study.compiled.decoder
    for i, row in zip(indices, answers, strict=True):
        if not row["identical"]:
            row["divergence"] = divergence(forward, study.encoded[i], row["ar_tokens"], row["spec_tokens"])


def _answer_rows(
    prompts: list[Prompt], indices: list[int], spec: GenerationOutput, ar: GenerationOutput, tokenizer
) -> list[dict]:
    rows = []
    for j, i in enumerate(indices):
        rows.append({
            "prompt_id": prompts[i].id, "category": prompts[i].category,
            "spec_tokens": spec.tokens[j], "ar_tokens": ar.tokens[j],
            "spec_text": tokenizer.decode(spec.tokens[j]) if tokenizer else None,
            "ar_text": tokenizer.decode(ar.tokens[j]) if tokenizer else None,
            "identical": spec.tokens[j] == ar.tokens[j],
        })
    return rows


def warm_graphs(study: Study, batches: list[list[int]]) -> None:
    """runtime.compile=true: compile every graph the timed decodes take before any is timed, where a
    graph compiled inside a timed decode (seconds) would be charged to its arm: the target's passes
    (each batch size's prompt pass, passes of 1..K+1 tokens, of a tree and with the hidden states a
    feature draft reads), and the draft's own steps: each kind of step a short untimed decode of the
    first batch of each size at each K meets, over 1..K+1 tokens. (A draft's feed after more rounds
    without it than that, under draft.k=auto, can still meet a new bucket: summary.json counts it.)"""
    if study.compiled is None:
        return
    from torch._dynamo.utils import counters  # imported here: torch._dynamo is slow to import

    traits = study.drafter.traits if study.k_max else None
    sizes = [len(indices) for indices in batches]
    prompt_lengths = [max(len(study.encoded[i]) for i in indices) for indices in batches]
    capacity = max(prompt_lengths) + study.max_new_tokens + study.k_max + 1  # the longest decode's booking
    started, graphs = time.perf_counter(), counters["stats"]["unique_graphs"]
    hidden = traits.hidden_layers if traits is not None else ()
    trees = [False] + ([True] if traits is not None and traits.branches > 1 else [])
    study.compiled.warm(sizes, [*range(1, study.k_max + 2), *prompt_lengths], capacity,
                        [full_pass(study.compiled.n_layers, layers, tree) for layers in {(), hidden} for tree in trees])
    if study.sampling.greedy:  # a greedy round's verify and commit, for every proposal width
        eos = torch.tensor(study.target.eos_token_ids, dtype=torch.long, device=study.target.model.device)
        study.compiler.warm_settle(sizes, range(study.k_max + 1), study.target.vocab_size, eos, tree=trees[-1])
    if traits is not None and traits.models:
        firsts = {len(indices): indices for indices in reversed(batches)}.values()  # the first batch of each size
        for indices, k in ((indices, k) for indices in firsts for k in range(1, study.k_max + 1)):
            generate(study.forward, [study.encoded[i] for i in indices], study.drafter, study.sampling, 2 * k + 3,
                     study.target.eos_token_ids, torch.Generator(study.target.model.device).manual_seed(study.seed),
                     study.target.pad_token_id, k_max=k, compiled_settle=study.compiler.settle)
        study.compiler.warm(sizes, range(1, study.k_max + 2), capacity)  # each kind of step those met, every size
    print(f"[compile] {counters['stats']['unique_graphs'] - graphs} graph(s) compiled before timing in "
          f"{time.perf_counter() - started:.1f} s")


def run_study(study: Study, results: JobResults, tracker, warmup: bool = True) -> dict:
    """Decode every batch with the AR baseline and the draft, then time the same work again until
    the speedup's interval is narrow enough (specexp.study.timing); write results as batches finish."""
    batches = make_batches(study.prompts, study.batch_size, study.batch_by_category)
    if warmup:
        warm_up(study, batches)
    if study.compiler is not None:
        study.compiler.timing_begins()
    decoded = first_pass(study, batches, results)
    records, timing_record = time_again(study, batches, decoded.records, decoded.policies, decoded.seconds)
    rounds, timings = pd.concat(decoded.rounds, ignore_index=True), pd.DataFrame(records)
    summary = summarize(rounds, timings, run_facts(study, decoded.answers, timing_record)).to_dict()
    if summary["greedy_divergences"]:
        print(divergence_line(summary["greedy_divergences"], len(decoded.answers), study.target.model.dtype))
    results.finish(summary, rounds, timings, study.profile.record() if study.profile is not None else None)
    tracker.log_run(summary, rounds, decoded.answers)
    return summary


def decode(study: Study, indices: list[int], with_draft: bool, seed: int, max_new: int,
           policy: KPolicy | None) -> GenerationOutput:
    """One arm's decode of the prompts at ``indices`` (the draft's, or the target alone)."""
    target = study.target
    generator = torch.Generator(device=target.model.device).manual_seed(seed)
    return generate(study.forward, [study.encoded[i] for i in indices], study.drafter if with_draft else None,
                    study.sampling, max_new, target.eos_token_ids, generator, target.pad_token_id, clock=study.clock,
                    k_policy=policy if with_draft else None, k_max=study.k_max if with_draft else 0,
                    compiled_settle=None if study.compiler is None else study.compiler.settle)


def time_batch(study: Study, n: int, indices: list[int], repeat: int,
               policy: KPolicy | None) -> dict[bool, GenerationOutput]:
    """One timing of both arms of batch n; the arm that leads alternates by batch and flips in every odd
    repeat, so a pass's two timings of a batch run A B, then B A (specexp.study.timing)."""
    order = (True, False) if (n + repeat) % 2 == 1 else (False, True)
    return {with_draft: decode(study, indices, with_draft, study.seed + n, study.max_new_tokens, policy)
            for with_draft in order}


def warm_up(study: Study, batches: list[list[int]]) -> None:
    """Compile the graphs, then decode with both arms on the first batch's own shapes, untimed and without
    the K policy (the draft proposes its most), because first calls allocate and pick kernels and the
    policy's counts must start clean."""
    warm_graphs(study, batches)
    for with_draft in (False, True):
        decode(study, batches[0], with_draft, study.seed, min(study.max_new_tokens, WARMUP_TOKENS), None)


@dataclass
class FirstPass:
    """What the first pass decoded and how long it took: the round tables of both arms per batch, both
    timings of each batch (A B, then B A), each prompt's answers and the K policy's state before each batch."""
    rounds: list[pd.DataFrame]
    records: list[dict]
    answers: list[dict]
    policies: list
    seconds: float


def first_pass(study: Study, batches: list[list[int]], results: JobResults) -> FirstPass:
    """Decode every batch with both arms (answers written as each batch finishes) and time it twice."""
    decoded = FirstPass([], [], [], [], 0.0)
    started = time.perf_counter()
    progress = tqdm(batches, desc="prompts", unit="batch", dynamic_ncols=True)
    for n, indices in enumerate(progress):
        decoded.policies.append(copy.deepcopy(study.k_policy))  # the state later passes repeat this batch from
        outs = time_batch(study, n, indices, 0, study.k_policy)
        spec, ar = outs[True], outs[False]
        batch_prompts = [study.prompts[i] for i in indices]
        decoded.rounds += [round_table(spec, batch_prompts, "spec", n, study.k_max),
                           round_table(ar, batch_prompts, "ar", n, 0)]
        prompt_length = max(len(study.encoded[i]) for i in indices)
        decoded.records += batch_records_of(outs, n, 0, batch_prompts[0].category, prompt_length)
        again = time_batch(study, n, indices, 1, copy.deepcopy(decoded.policies[n]))  # B A: the pass's second half
        decoded.records += batch_records_of(again, n, 1, batch_prompts[0].category, prompt_length)
        answers = _answer_rows(study.prompts, indices, spec, ar, study.target.tokenizer)
        if study.sampling.greedy:
            _add_divergences(study, indices, answers)
        decoded.answers += answers
        results.add_answers(answers)
        progress.set_postfix(spec_tok_s=f"{sum(len(t) for t in spec.tokens) / spec.total_s:.1f}",
                             ar_tok_s=f"{sum(len(t) for t in ar.tokens) / ar.total_s:.1f}")
    decoded.seconds = time.perf_counter() - started
    return decoded


def run_facts(study: Study, answers: list[dict], timing_record: dict) -> RunFacts:
    """What the summary says of the run besides its tables."""
    drafter = study.drafter
    return RunFacts(k_max=study.k_max, batches_by_category=study.batch_by_category, profile=study.profile,
                    draft_profile=study.draft_profile, draft=study.draft_name, target=study.target.name,
                    k_policy=study.k_setting, n_prompts=len(study.prompts),
                    vocab_overlap=drafter.traits.vocab_overlap if drafter is not None else None,
                    runtime=study.runtime | ({} if study.compiler is None else study.compiler.stats()),
                    timing=timing_record, greedy_answers=answers if study.sampling.greedy else None)


def batch_records_of(outs: dict[bool, GenerationOutput], n: int, repeat: int, category: str | None,
                     prompt_length: int) -> list[dict]:
    """batches.parquet's rows of one timing of batch n: one per arm, saying which arm ran first."""
    first = "spec" if next(iter(outs)) else "ar"
    return [batch_record(outs[with_draft], "spec" if with_draft else "ar", n, category, prompt_length) |
            {"repeat": repeat, "first": first} for with_draft in (True, False)]


def time_again(study: Study, batches: list[list[int]], records: list[dict], policies: list,
               first_pass_s: float) -> tuple[list[dict], dict]:
    """The pilot's other passes, then the passes the pilot plans (specexp.study.timing; timings only,
    the same work); returns every timing record, each marked `pilot` or not, and what the timing did
    (summary.json's `timing`)."""
    settings, per_pass = study.timing, timing.TIMINGS_PER_PASS

    def time_pass(p: int) -> float:
        started = time.perf_counter()
        for n, indices in enumerate(tqdm(batches, desc=f"timing pass {p + 1}", unit="batch", dynamic_ncols=True)):
            for repeat in range(per_pass * p, per_pass * (p + 1)):
                outs = time_batch(study, n, indices, repeat, copy.deepcopy(policies[n]))
                records.extend(batch_records_of(outs, n, repeat, study.prompts[indices[0]].category,
                                                max(len(study.encoded[i]) for i in indices)))
        return time.perf_counter() - started

    pass_s = [first_pass_s] + [time_pass(p) for p in range(1, settings.repeats)]
    pilot = intervals.paired_timings(pd.DataFrame(records))
    spread = intervals.speedup_spread(pilot) if intervals.too_few(pilot["batch"].nunique(), "") is None else None
    planned, reason = timing.plan_passes(settings, spread, intervals.paired_speedup(pilot), float(np.mean(pass_s)))
    extra_s = 0.0
    for p in range(settings.repeats, planned):
        if extra_s + pass_s[-1] > settings.budget_s:
            planned, reason = p, "budget"  # the passes ran slower than the pilot's
            break
        pass_s.append(time_pass(p))
        extra_s += pass_s[-1]
    for record in records:
        record["pilot"] = record["repeat"] < per_pass * settings.repeats
    interval = intervals.speedup_interval(intervals.paired_timings(pd.DataFrame(records)))
    if (message := timing.stop_message(reason, settings, planned, interval)) is not None:
        print(f"[timing] {message}", file=sys.stderr)
    return records, {"passes": planned, "timings_per_batch": per_pass * planned, "pilot_passes": settings.repeats,
                     "target_halfwidth": settings.target_halfwidth, "stopped": reason, "extra_s": extra_s,
                     **{k: v for k, v in interval.items() if k != "speedup_ci95"}}


def config_hash(cfg: DictConfig) -> str:
    """Identifies what a job computes: the resolved config without force and logger."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    for key in ("force", "logger"):
        plain.pop(key, None)
    resolved = OmegaConf.to_yaml(OmegaConf.create(plain), resolve=True)
    return hashlib.sha256(resolved.encode()).hexdigest()[:16]


def run_job(cfg: DictConfig, results: JobResults) -> dict:
    """Check every input, then decode and write one job's results (and log them)."""
    study = prepare(cfg)
    results.begin(OmegaConf.to_yaml(cfg, resolve=True))
    tracker = instantiate(cfg.logger)(config=OmegaConf.to_container(cfg, resolve=True))
    failed = True
    try:
        torch.manual_seed(cfg.seed)
        summary = run_study(study, results, tracker, warmup=cfg.warmup)
        failed = False
    finally:
        tracker.finish(failed=failed)  # one failed job never breaks W&B for the next
    return summary


def run_from_config(cfg: DictConfig, out_dir: Path) -> dict:
    """A job outside Hydra's runner (benchmarks, notebooks)."""
    return run_job(cfg, JobResults(out_dir, config_hash(cfg)))
