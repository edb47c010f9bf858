"""Acceptance predicted before decoding for (target, draft) pairs, priced at every K: the target's
continuations, each draft replayed along them (study/replay.py), the rounds priced with this
machine's profile (`python -m specexp.pairing`; its table and ranking: reporting/ranking.py)."""

import statistics

import numpy as np
import torch
from omegaconf import DictConfig, open_dict
from tqdm import tqdm

from specexp.costs.cost_model import price_rounds, round_yields
from specexp.drafts.build import build_draft, resolve_draft_k
from specexp.errors import UserInputError
from specexp.study import intervals
from specexp.study.references import continuations
from specexp.study.replay import ReplayedRounds, acceptance_curve, alpha, replay, teacher_forced
from specexp.study.run import Study, prepare

# Prompts are replayed together because a draft's step reads its weights once whatever its rows, so more
# rows cost little on a CPU (docs/lab_notes/code_measurements.md: replayed rows); p of every position is held
# for them under sampling.
REPLAY_ROWS = 8


def references(study: Study, extra: int) -> list[list[int]]:
    """The target's own continuation of each prompt, ``extra`` tokens past max_new_tokens (the last round's
    proposal is judged in full): greedy, or sampled with the study's warp (prompt i seeded seed + i); kept
    for the process (study/references.py), so the drafts of one target are replayed along the same ones."""
    return continuations(study.forward, study.target, study.encoded, study.max_new_tokens + extra, study.batch_size,
                         study.sampling, study.seed)


def replay_drafter(draft_cfg: DictConfig, study: Study, built=None):
    """The draft the replay runs for ``draft_cfg`` (``built``: the study's drafter of it): a draft that
    runs the target's pass itself hands over its standalone self (SharesTargetPass.standalone), since
    no target pass runs in a replay."""
    drafter = built if built is not None else build_draft(draft_cfg, study.target).drafter
    return drafter.standalone() if drafter.traits.shares_target_pass else drafter


def fixed_k_config(draft_cfg: DictConfig, k: int) -> DictConfig | None:
    """The draft config a study at draft.k=k builds where it is not the one built for the K policy
    (a prompt lookup's caps on short matches apply at a fixed K only); None where it is the same
    but for K, and the replay at k_max, cut at k, stands for it."""
    fixed = draft_cfg.copy()
    with open_dict(fixed):
        fixed.k = k
    built, as_policy = resolve_draft_k(fixed)[0], resolve_draft_k(draft_cfg)[0]
    with open_dict(built), open_dict(as_policy):
        built.pop("k"), as_policy.pop("k")
    return None if built == as_policy else fixed


def predict_pair(cfg: DictConfig, target_name: str, draft_name: str) -> list[dict]:
    """One row per K = 0..k_max (K = 0: the draft declined, as draft.k=auto may choose; AR's price): the
    replayed acceptance and the cost model's tau and speedup of a study at draft.k=K. The draft built
    for k_max is replayed once and its rounds cut at each K; a K whose study builds another draft
    (fixed_k_config) replays that one at K."""
    study = prepare(cfg)
    if study.k_max < 1:
        raise UserInputError(f"draft={draft_name} never proposes (k_max = 0): nothing to predict")
    drafter = replay_drafter(cfg.draft, study, study.drafter)
    k_top = min(study.k_max, drafter.traits.k_limit or study.k_max)
    replays = {None: (drafter, study.k_max)}  # K it stands for (None: every K cut from k_max) -> (draft, K replayed)
    for k in range(1, k_top + 1):
        if (fixed := fixed_k_config(cfg.draft, k)) is not None:
            replays[k] = (replay_drafter(fixed, study), k)
    refs = references(study, study.k_max)
    for replayed, _ in replays.values():
        if replayed.traits.needs_reference:
            replayed.set_reference(study.encoded, refs)
    device = study.target.model.device
    generator = torch.Generator(device).manual_seed(study.seed)
    rounds = {key: ReplayedRounds() for key in replays}
    for first in tqdm(range(0, len(refs), REPLAY_ROWS), desc=f"{target_name} x {draft_name}", unit="batch",
                      leave=False):
        prompts, continuations = study.encoded[first : first + REPLAY_ROWS], refs[first : first + REPLAY_ROWS]
        probs, features = zip(*(teacher_forced(study.target.model, ids, ref, study.sampling,
                                               drafter.traits.hidden_layers)
                                for ids, ref in zip(prompts, continuations, strict=True)), strict=True)
        for key, (replayed, k) in replays.items():
            q_along = (replayed.q_along(prompts, continuations, study.sampling)  # q on R's own prefix (MarkovChain)
                       if replayed.traits.markov_chain and not study.sampling.greedy else None)
            rounds[key].extend(replay(replayed, prompts, continuations, list(probs), list(features), k, study.sampling,
                                      generator, device, new_tokens=study.max_new_tokens, q_along=q_along),
                               first_prompt=first)
    prompt_length = statistics.mean(len(ids) for ids in study.encoded)
    context = prompt_length + statistics.mean(min(len(r), study.max_new_tokens) for r in refs) / 2
    rows = []
    for k in range(0, k_top + 1):
        at_k = rounds.get(k, rounds[None])
        priced = (price_replayed(at_k, k, study, context, prompt_length) if study.profile is not None
                  else {"predicted_tau": None, "predicted_speedup": None, "predicted_speedup_ci95": None})
        rows.append({"target": target_name, "draft": draft_name,
                     "data": cfg.data.get("_target_", "").rsplit(".", 1)[-1],
                     "temperature": study.sampling.temperature, "k": k, "predicted_alpha": alpha(at_k, k),
                     "predicted_acceptance_pos1": acceptance_curve(at_k, max(k, 1))[0], **priced,
                     "rounds": len(at_k.run), "replayed_at_k": k in rounds,
                     # K the study's rounds would verify on average: a draft may propose fewer (a short match)
                     "mean_k": float(np.minimum(at_k.proposed, k).mean()) if at_k.proposed else float(k),
                     "replay_draft_ms_per_batch_round": 1e3 * statistics.mean(at_k.draft_s) if at_k.draft_s else None,
                     "profile": study.profile.path if study.profile is not None else None})
    best = max(rows, key=lambda r: r["predicted_speedup"] or 0.0)["k"]
    return [row | {"best_k": best, "is_best_k": row["k"] == best} for row in rows]


def price_replayed(rounds: ReplayedRounds, k: int, study: Study, context: float, prompt_length: float,
                   resamples: int = 1000) -> dict:
    """The cost model's tau and speedup of the replayed rounds at K = k, each round priced with its own
    proposal length (cost_model.round_yields), and a 95% percentile interval of the speedup over
    prompts drawn with replacement (None from one prompt)."""
    tokens, target_s = round_yields(rounds.run, np.asarray(rounds.proposed), k, study.profile, study.draft_profile,
                                    context)
    prompt = np.asarray(rounds.prompt)

    def speedup(tokens_per_round, target_s_per_round):
        return price_rounds(tokens_per_round, target_s_per_round, k, study.profile, study.draft_profile, context,
                            prompt_length, study.max_new_tokens)

    n_prompts = int(prompt.max()) + 1 if len(prompt) else 0
    interval = None
    if n_prompts >= intervals.MIN_UNITS:  # per prompt: its rounds' tokens, target seconds and count, resampled together
        sums = np.stack([np.bincount(prompt, tokens, n_prompts), np.bincount(prompt, target_s, n_prompts),
                         np.bincount(prompt, minlength=n_prompts)], 1)  # [P, 3]
        drawn = intervals.resample_counts(n_prompts, resamples, np.random.default_rng(study.seed)) @ sums  # [R, 3]
        with np.errstate(invalid="ignore", divide="ignore"):
            interval = intervals.percentile_interval(speedup(drawn[:, 0] / drawn[:, 2], drawn[:, 1] / drawn[:, 2]))
    return {"predicted_tau": float(tokens.mean()), "predicted_speedup": float(speedup(tokens.mean(), target_s.mean())),
            "predicted_speedup_ci95": interval}
