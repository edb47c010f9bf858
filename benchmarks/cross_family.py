"""Pairs across model families (issue 32): Gemma-3-270M drafted for by prompt lookup, by its own
first layers, and by SmolLM2-135M-Instruct through both vocabulary mappings; the reverse pair; and
transformers' own cross-tokenizer assisted generation on the same prompts, in one process.

  python benchmarks/cross_family.py [--prompts 8] [--max-new-tokens 64] [--k 3] [--out benchmarks/cross_family.md]

1. The lean runtime against transformers' forward on Gemma3: AR through our engine on each, the
   prompts taking turns, ms/token.
2. `target=gemma3_270m` on --prompts MT-bench and --prompts Spec-Bench prompts, greedy and T = 0.7,
   at a fixed K (no hardware profile: pricing every K on a 270M target with a 262k head costs more
   than the study): AR, prompt lookup, target_prefix (its first 4 layers and head), SmolLM2-135M
   with `string` and with `tli`; every prompt decoded by every method back to back (the order
   rotating per prompt). Each row: alpha and speedup with their 95% intervals, tau, c, the i.i.d.
   formula's prediction from that alpha and c (Leviathan et al.; a verify pass priced as one AR step)
   and realized/predicted, the vocabulary overlap, the re-encoding time per drafted round.
3. The reverse pair (SmolLM2-135M target, Gemma-3-270M as its draft), greedy: a draft twice the
   target's size cannot pay for itself (c > 1), so only its alpha and overlap say anything.
4. transformers' `generate(assistant_model=, tokenizer=, assistant_tokenizer=)` with the same
   SmolLM2 draft and K (constant schedule, no confidence stop): Universal Assisted Generation
   (string level) under greedy, Universal Speculative Decoding (token-level intersection) under
   T = 0.7, against our engine with the same draft and K; transformers' AR, its assisted decode,
   our AR and our speculative decode take turns per prompt after one untimed warm-up decode each,
   every speedup over transformers' AR (one baseline), both acceptances matched / proposed draft
   tokens (theirs from its candidate generator's (proposed, matched) per round; ours the study's
   drafted_acceptance_rate, accepted / proposed, not alpha's accepted / looked-at). Where its
   speculative sampling runs, each verified token is read against the q it was handed (the
   acceptance sum_x min(p, q) that q implies, and the probability q gives the drafted token against
   sum_x q(x)^2, its mean were the token drawn from q): an accepted share far above what q implies
   says q is not what the tokens were drawn from.
"""

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from common import decode_arguments, decode_ours, interleaved_summaries, report_header, write_report
from hydra import compose, initialize_config_dir
from transformers.generation import candidate_generator
from transformers.generation import utils as generation_utils

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench, spec_bench
from specexp.drafts.build import build_draft
from specexp.drafts.small_lm import small_lm_draft
from specexp.models import LoadedModel
from specexp.models.embedded import load_embedded_gemma3, load_embedded_target
from specexp.paths import CONFIG_DIR
from specexp.runtime import round_rows
from specexp.runtime.lean import LeanRuntime

SAMPLINGS = {"greedy": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7)}
DATA = {"mt_bench": mt_bench, "spec_bench": spec_bench}
# method -> the draft config and its overrides, as `python -m specexp target=gemma3_270m draft=... ` builds it
METHODS = {"prompt_lookup": ("prompt_lookup", ()), "target_prefix": ("target_prefix", ()),
           "smollm2 string": ("smollm2_135m", ("draft.vocab_mapping=string",)),
           "smollm2 tli": ("smollm2_135m", ("draft.vocab_mapping=tli",))}


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_ci(value, interval) -> str:
    lo, hi = interval or (None, None)
    return f"{fmt(value)} [{fmt(lo)}, {fmt(hi)}]"


def built(target: LoadedModel, config: str, overrides: tuple[str, ...], k: int):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["target=gemma3_270m", f"draft={config}", f"draft.k={k}",
                                                       *overrides])
    return build_draft(cfg.draft, target).drafter


def runtime_cost(target: LoadedModel, lean_forward, encoded: list[list[int]], max_new: int) -> list[str]:
    """AR ms/token through our engine: transformers' forward and the lean decoder taking turns."""
    seconds, tokens, same = {"hf": [], "lean": []}, {"hf": [], "lean": []}, 0
    decode_ours(target, encoded[0], None, 4, lean_forward)  # warm-up both
    decode_ours(target, encoded[0], None, 4)
    for i, ids in enumerate(encoded):
        outs = {}
        for side in (("hf", "lean") if i % 2 == 0 else ("lean", "hf")):
            out = decode_ours(target, ids, None, max_new, lean_forward if side == "lean" else None)
            seconds[side].append(out.total_s)
            tokens[side].append(len(out.tokens[0]))
            outs[side] = out.tokens[0]
        same += outs["hf"] == outs["lean"]
    ms = {side: 1e3 * sum(seconds[side]) / sum(tokens[side]) for side in seconds}
    ratios = [h / t_h / (l_ / t_l) for h, t_h, l_, t_l in
              zip(tokens["lean"], seconds["lean"], tokens["hf"], seconds["hf"], strict=True)]
    return ["| runtime | ms/token | lean speedup (median per prompt) | identical |", "|---|---|---|---|",
            f"| runtime=hf (transformers' Gemma3 forward) | {ms['hf']:.1f} | - | - |",
            f"| runtime=lean | {ms['lean']:.1f} | {statistics.median(ratios):.3f} | {same}/{len(encoded)} |"]


class CandidateLog:
    """(proposed, matched) per round of transformers' cross-tokenizer candidate generators, while in
    its ``with`` block (USD's get_candidates calls UAG's: only the outermost call counts); and, for
    each token its speculative sampling verifies, read against the q it was handed: q(drafted token),
    sum_x q(x)^2 (the mean of the former when the token is drawn from q) and the acceptance that q
    implies, sum_x min(p, q) (Leviathan et al.; the accepted share estimates it when it is)."""

    CLASSES = (candidate_generator.AssistedCandidateGeneratorDifferentTokenizers,
               candidate_generator.UniversalSpeculativeDecodingGenerator)

    def __init__(self):
        self.proposed, self.matched, self._depth, self._saved = [], [], 0, []
        self.q_drafted, self.q_collision, self.overlap = [], [], []  # per verified token

    def __enter__(self) -> "CandidateLog":
        for cls in self.CLASSES:
            self._saved.append((cls, cls.__dict__.get("get_candidates"), cls.__dict__.get("update_candidate_strategy")))
        for cls in self.CLASSES:
            cls.get_candidates = self._logged_get(cls.get_candidates)
            cls.update_candidate_strategy = self._logged_update(cls.update_candidate_strategy)
        self._saved_sampling = generation_utils._speculative_sampling  # a module global, looked up per call
        generation_utils._speculative_sampling = self._logged_sampling(self._saved_sampling)
        return self

    def __exit__(self, *exc) -> None:
        generation_utils._speculative_sampling = self._saved_sampling
        for cls, get, update in self._saved:
            for name, original in (("get_candidates", get), ("update_candidate_strategy", update)):
                if original is None:
                    delattr(cls, name)  # it was inherited
                else:
                    setattr(cls, name, original)

    def _logged_get(self, get):
        def wrapped(generator, input_ids, **kwargs):
            self._depth += 1
            try:
                candidates, logits = get(generator, input_ids, **kwargs)
            finally:
                self._depth -= 1
            if self._depth == 0:
                self.proposed.append(candidates.shape[1] - input_ids.shape[1])
            return candidates, logits
        return wrapped

    def _logged_update(self, update):
        def wrapped(generator, input_ids, scores, num_matches):
            self._depth += 1
            try:
                return update(generator, input_ids, scores, num_matches)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.matched.append(int(num_matches))
        return wrapped

    def _logged_sampling(self, speculative_sampling):
        def wrapped(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs):
            q = candidate_logits[0].float().softmax(-1)  # (L, V): what transformers treats as the draft's q
            p = new_logits[0, :candidate_length].float().softmax(-1)  # (L, V): the target's processed p
            drafted = candidate_input_ids[0, -candidate_length:]
            self.q_drafted += q[torch.arange(candidate_length), drafted].tolist()
            self.q_collision += q.square().sum(-1).tolist()
            self.overlap += torch.minimum(p, q).sum(-1).tolist()
            return speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs)
        return wrapped

    def alpha(self) -> float | None:
        return sum(self.matched) / sum(self.proposed) if sum(self.proposed) else None


@torch.inference_mode()
def head_to_head(target: LoadedModel, draft: LoadedModel, ours, forward, encoded: list[list[int]],
                 sampling: SamplingConfig, max_new: int, k: int) -> dict[str, dict]:
    """transformers' AR generate, its cross-tokenizer assisted generate, and our engine's AR and
    speculative decode with ``ours`` (the same draft and K) on ``forward``, all four taking turns per
    prompt (the order rotating) after one untimed warm-up decode each. Both acceptances are matched /
    proposed draft tokens (ours: accepted / proposed, the study's drafted_acceptance_rate); every
    side's speedup is over transformers' AR, the one baseline. The assistant is a copy of the draft:
    USD prunes its assistant's LM head and embedding in place, once per cached translator."""
    assistant = copy.deepcopy(draft.model)
    # its translator (and the head pruned with it) is cached per tokenizer pair: one for this copy
    candidate_generator.AssistantVocabTranslatorCache._cache.clear()
    assistant.generation_config.num_assistant_tokens = k
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    sample = {"do_sample": False} if sampling.greedy else {"do_sample": True, "temperature": sampling.temperature,
                                                           "top_k": 0, "top_p": 1.0}
    sides = ("transformers AR", "transformers assisted", "specexp AR", "specexp spec")
    seconds, tokens = {side: [] for side in sides}, {side: [] for side in sides}
    proposed, accepted = ({"transformers assisted": 0, "specexp spec": 0},
                          {"transformers assisted": 0, "specexp spec": 0})
    rounds = {"transformers assisted": 0, "specexp spec": 0}
    verified = {"q_drafted": [], "q_collision": [], "overlap": []}  # per token transformers' speculative sampling read

    def decode(side: str, ids: list[int], new: int, seed: int) -> tuple[int, float, tuple[int, int, int], dict]:
        """New tokens, seconds, (proposed, accepted, rounds) and CandidateLog's per-token readings of one decode."""
        if side.startswith("specexp"):
            out = generate(forward, [ids], ours if side == "specexp spec" else None, sampling, new,
                           target.eos_token_ids, torch.Generator().manual_seed(seed), target.pad_token_id)
            return len(out.tokens[0]), out.total_s, (int(out.n_proposed.sum()), int(out.n_accepted.sum()),
                                                     int(out.active.sum())), {}
        x = torch.tensor([ids])
        extra = {} if side == "transformers AR" else {"assistant_model": assistant, "tokenizer": target.tokenizer,
                                                       "assistant_tokenizer": draft.tokenizer}
        before = (sum(log.proposed), sum(log.matched), len(log.proposed), len(log.q_drafted))
        torch.manual_seed(seed)
        start = time.perf_counter()
        out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                    pad_token_id=target.pad_token_id, **sample, **extra)
        took = time.perf_counter() - start
        return out.shape[1] - len(ids), took, (sum(log.proposed) - before[0], sum(log.matched) - before[1],
                                               len(log.proposed) - before[2]), {name: getattr(log, name)[before[3]:]
                                                                                for name in verified}

    with CandidateLog() as log:
        for side in sides:  # warm-up: each side's first decode pays its one-time costs untimed
            decode(side, encoded[0], 4, 0)
        failed = []
        for i, ids in enumerate(encoded):
            try:  # a prompt counts for every side or for none
                decoded = {side: decode(side, ids, max_new, i)
                           for side in sides[i % len(sides):] + sides[: i % len(sides)]}
            except RuntimeError as error:  # transformers' assisted decode can raise on a prompt (an empty draft pass)
                failed.append(f"{i}: {str(error).splitlines()[0][:80]}")
                continue
            for side, (n, took, (p, a, r), readings) in decoded.items():
                for name, values in readings.items():
                    verified[name] += values
                seconds[side].append(took)
                tokens[side].append(n)
                if side in proposed:
                    proposed[side], accepted[side], rounds[side] = (proposed[side] + p, accepted[side] + a,
                                                                    rounds[side] + r)
    if not seconds["transformers AR"]:
        return {side: {"tokens_per_s": None, "speedup": None, "acceptance": None, "tau": None, "prompts": 0,
                       "failed": failed} for side in sides}
    per_s = {side: sum(tokens[side]) / sum(seconds[side]) for side in sides}
    baseline = per_s["transformers AR"]
    return {side: {"tokens_per_s": per_s[side], "speedup": per_s[side] / baseline,
                   "acceptance": accepted[side] / proposed[side] if proposed.get(side) else None,
                   "tau": sum(tokens[side]) / max(rounds[side], 1) if side in rounds else None,
                   "prompts": len(seconds[side]), "failed": failed,
                   **{name: statistics.fmean(values) if side == "transformers assisted" and values else None
                      for name, values in verified.items()}}
            for side in sides}


def main_tables(target: LoadedModel, smollm2: LoadedModel, prompts: int, max_new: int, k: int) -> dict[str, list[str]]:
    drafters = {name: built(target, config, overrides, k) for name, (config, overrides) in METHODS.items()}
    prepared = LeanRuntime().prepare(target, drafters["smollm2 string"], round_rows(1, k + 1))
    for drafter in drafters.values():  # each draft's own models planned, as a study does
        LeanRuntime().prepare(target, drafter, round_rows(1, k + 1))
    rows = ["| data | sampling | method | alpha [95%] | tau | c | speedup [95%] | predicted (iid) | realized/pred "
            "| overlap | re-encode ms/round | identical |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    theirs = ["| data | sampling | side | prompts | accepted / proposed | sum min(p, q) | q(drafted) | sum q^2 "
              "| tokens per round | speedup over transformers AR | tokens/s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    failures = []
    encoded_sets = {}
    for data_name, loader in DATA.items():
        chosen = loader(limit=prompts)
        encoded = encode_prompts(target.tokenizer, chosen, chat_template=True)
        encoded_sets[data_name] = encoded
        for sampling_name, sampling in SAMPLINGS.items():
            methods = {"ar": (None, 0)} | {name: (drafter, k) for name, drafter in drafters.items()}
            results = interleaved_summaries(target, chosen, encoded, methods, sampling, max_new, 0,
                                            desc=f"{data_name} {sampling_name}", forward=prepared.forward)
            for name, r in results.items():
                identical = f"{r['identical']}/{len(chosen)}" if sampling.greedy else "-"
                predicted = r["predicted_speedup_iid"]
                realized = r["speedup"] / predicted if r["speedup"] and predicted else None
                overlap = drafters[name].traits.vocab_overlap
                reencode = r["reencode_ms_per_round"] if overlap is not None else None
                rows.append(f"| {data_name} | {sampling_name} | {name} | {fmt_ci(r['alpha'], r['alpha_ci95'])} | "
                            f"{fmt(r['tau'])} | {fmt(r['cost_ratio_c'])} | {fmt_ci(r['speedup'], r['speedup_ci95'])} "
                            f"| {fmt(predicted)} | {fmt(realized)} | {fmt(overlap)} | {fmt(reencode, 2)} "
                            f"| {identical} |")
            ours_name = "smollm2 string" if sampling.greedy else "smollm2 tli"
            mapping = "UAG (string)" if sampling.greedy else "USD (tli)"
            for side, r in head_to_head(target, smollm2, drafters[ours_name], prepared.forward, encoded, sampling,
                                        max_new, k).items():
                label = {"transformers assisted": f"{side}: {mapping}",
                         "specexp spec": f"{side}: {ours_name}"}.get(side, side)
                theirs.append(f"| {data_name} | {sampling_name} | {label} | {r['prompts']} | {fmt(r['acceptance'])} | "
                              f"{fmt(r.get('overlap'))} | {fmt(r.get('q_drafted'))} | {fmt(r.get('q_collision'))} | "
                              f"{fmt(r['tau'])} | {fmt(r['speedup'])} | "
                              f"{fmt(r['tokens_per_s'], 1)} |")
            failures += [f"- {data_name} {sampling_name}, prompt {f}" for f in r["failed"]]
    runtime = runtime_cost(target, prepared.forward, encoded_sets["mt_bench"], max_new)
    return {"rows": rows, "theirs": theirs, "runtime": runtime, "failures": failures}


def reverse_table(gemma: LoadedModel, prompts: int, max_new: int, k: int) -> list[str]:
    """SmolLM2-135M-Instruct as the target, Gemma-3-270M drafting for it, greedy."""
    target = load_embedded_target(dtype="float32", device="cpu")
    drafters = {m: small_lm_draft(target, gemma, k=k, vocab_mapping=m) for m in ("string", "tli")}
    prepared = LeanRuntime().prepare(target, drafters["string"], round_rows(1, k + 1))
    rows = ["| data | mapping | alpha [95%] | tau | c | speedup [95%] | overlap | re-encode ms/round | identical |",
            "|---|---|---|---|---|---|---|---|---|"]
    for data_name, loader in DATA.items():
        chosen = loader(limit=prompts)
        encoded = encode_prompts(target.tokenizer, chosen, chat_template=True)
        methods = {"ar": (None, 0)} | {m: (d, k) for m, d in drafters.items()}
        results = interleaved_summaries(target, chosen, encoded, methods, SamplingConfig(), max_new, 0,
                                        desc=f"reverse {data_name}", forward=prepared.forward)
        for m, r in results.items():
            rows.append(f"| {data_name} | {m} | {fmt_ci(r['alpha'], r['alpha_ci95'])} | {fmt(r['tau'])} | "
                        f"{fmt(r['cost_ratio_c'])} | {fmt_ci(r['speedup'], r['speedup_ci95'])} | "
                        f"{fmt(drafters[m].traits.vocab_overlap)} | {fmt(r['reencode_ms_per_round'], 2)} | "
                        f"{r['identical']}/{len(chosen)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=3)
    args = decode_arguments(parser, Path(__file__).parent / "cross_family.md").parse_args()
    gemma = load_embedded_gemma3(dtype="float32", device="cpu")
    smollm2 = load_embedded_target(dtype="float32", device="cpu")  # transformers' assistant: a copy of its own
    tables = main_tables(gemma, smollm2, args.prompts, args.max_new_tokens, args.k)
    reverse = reverse_table(gemma, args.prompts, args.max_new_tokens, args.k)
    lines = [*report_header("Cross-family pairs: Gemma-3-270M and SmolLM2-135M-Instruct"),
             f"{args.prompts} prompts per set x {args.max_new_tokens} new tokens, batch 1, K = {args.k} fixed, "
             "one process, methods interleaved per prompt after a warm-up decode each; 95% intervals as the "
             "study's (specexp.study.intervals).", "",
             "## The lean runtime on Gemma3 (AR, MT-bench)", "", *tables["runtime"], "",
             "## target=gemma3_270m", "", *tables["rows"], "",
             "## Against transformers' cross-tokenizer assisted generation (same prompts, same draft, same K)", "",
             "Where transformers' speculative sampling verifies (USD, under sampling), each verified token is "
             "also read against the q it was handed (means over verified tokens): `sum min(p, q)` is the "
             "acceptance that q implies, `q(drafted)` the probability q gives the token drafted and `sum q^2` "
             "what that mean is when the token is drawn from q. Where q is what the tokens were drawn from, the "
             "accepted share estimates `sum min(p, q)` and `q(drafted)` matches `sum q^2`; where they part, q "
             "is not the draft's distribution, p / q is not the ratio speculative sampling needs, and the output "
             "does not follow the target's distribution.", "",
             *tables["theirs"], "",
             "Prompts on which transformers' assisted generation raised (left out for all four sides of that setting):",
             "", *(tables["failures"] or ["- none"]), "",
             "## The reverse pair: target SmolLM2-135M-Instruct, draft Gemma-3-270M (greedy)",
             "", *reverse]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
