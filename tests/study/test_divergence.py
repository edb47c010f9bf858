"""Where greedy arms differ (specexp.study.divergence): the first divergence and its logit gap in
rounding steps, found by run_study for every prompt whose arms differ."""

import json

import torch

from specexp.core.sampling import SamplingConfig
from specexp.data import Prompt
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.study.divergence import divergence, first_divergence, rounding_step
from specexp.study.results import JobResults
from specexp.study.run import Study, run_study
from specexp.study.timing import TimingSettings
from specexp.study.tracking import NullTracker, divergence_columns


def test_first_divergence_is_the_first_position_both_arms_filled_differently():
    assert first_divergence([1, 2, 3, 4], [1, 2, 5, 4]) == 2
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2], [1, 2, 3]) is None  # one stopped earlier (EOS): no token to compare


def test_rounding_step_is_the_dtype_spacing_at_the_value():
    assert rounding_step(1.0, torch.bfloat16) == 2**-7
    assert rounding_step(-12.0, torch.bfloat16) == 2**-7 * 8  # 12 lies in [8, 16)
    assert rounding_step(3.0, torch.float32) == 2**-23 * 2
    assert rounding_step(0.0, torch.float32) == torch.finfo(torch.float32).tiny


def test_divergence_reads_the_gap_from_one_pass_over_the_prompt_and_the_tokens_before(target):
    prompt, ar = [5, 6, 7], [9, 10, 11, 12]
    spec = [9, 10, 3, 40]
    found = divergence(target.model, prompt, ar, spec)
    with torch.inference_mode():
        logits = target.model(torch.tensor([prompt + ar[:2]])).logits[0, -1]  # [V]
    assert found["position"] == 2 and (found["ar_token"], found["spec_token"]) == (11, 3)
    assert abs(found["logit_gap"] - float(logits[11] - logits[3])) < 1e-6  # another pass shape: not bit-equal
    assert found["rounding_step"] == rounding_step(max(abs(float(logits[11])), abs(float(logits[3]))), torch.float64)
    assert divergence(target.model, prompt, ar, list(ar)) is None


class VerifyPassRounding:
    """The target whose passes over several tokens round their logits to steps of 1/256, as another
    kernel's rounding would: near-tied argmaxes of a verify pass can go the other way than the
    1-token passes' (the bf16 case on a GPU, made large and deterministic)."""

    def __init__(self, model):
        self.model, self.config, self.device, self.dtype = model, model.config, model.device, model.dtype

    def __call__(self, input_ids, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        if input_ids.shape[1] > 1:
            out.logits = torch.round(out.logits * 256) / 256
        return out


def test_run_study_records_where_greedy_arms_differ(tmp_path, target):
    """A self-draft verified through the rounding passes: wherever the target's two best logits lie
    within 1/256 the verify pass may keep the other one. Every differing prompt gets its first
    divergence in answers.jsonl and summary.json, with a gap within that rounding."""
    prompts = [Prompt(id=str(i), text="", category="c") for i in range(6)]
    encoded = [[5 + i, 6, 7 + i % 3] for i in range(6)]
    forward = VerifyPassRounding(target.model)
    study = Study(target, SmallLMDrafter(target, target, k=3), 3, prompts, encoded, SamplingConfig(), 16, 1, True, 0,
                  forward, {}, timing=TimingSettings(repeats=1, target_halfwidth=None))
    results = JobResults(tmp_path, "test")
    results.begin("")
    summary = run_study(study, results, NullTracker())
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    differing = [a for a in answers if not a["identical"]]
    assert 0 < len(differing) < len(answers)  # the rounding flips some near-ties, not all prompts
    assert abs(summary["greedy_match"] - (1 - len(differing) / len(answers))) < 1e-12
    assert [d["prompt_id"] for d in summary["greedy_divergences"]] == [a["prompt_id"] for a in differing]
    for a in differing:
        d = a["divergence"]
        assert d["position"] == first_divergence(a["ar_tokens"], a["spec_tokens"])
        assert (d["ar_token"], d["spec_token"]) == (a["ar_tokens"][d["position"]], a["spec_tokens"][d["position"]])
        assert abs(d["logit_gap"]) <= 1 / 256  # tied within the verify pass's rounding
        assert divergence_columns(d) == [d["position"], abs(d["logit_gap"]) / d["rounding_step"]]  # W&B's samples
    assert all("divergence" not in a for a in answers if a["identical"])
    assert divergence_columns(None) == [None, None]

