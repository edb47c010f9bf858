"""The runtime's matmul plans: every formulation is the same product, planned models decode
exactly as before, and a machine's plan is measured once and then read back."""

import json
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.runtime import HFRuntime, draft_models, lean, matmul, round_rows
from specexp.runtime.decoder import lean_decoder
from specexp.runtime.lean import LeanRuntime
from specexp.runtime.matmul import FORMULATIONS, MatmulPlans, apply_plan, linear_modules, plan_linear, shape_key
from tests.commands import run_specexp
from tests.conftest import tiny_model
from tests.drafters import make_drafter


@pytest.mark.parametrize("name", FORMULATIONS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 17])
def test_every_formulation_is_the_same_product_as_f_linear(name, rows):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(300, 96, generator=g), torch.randn(300, generator=g)
    x = torch.randn(2, rows, 96, generator=g)
    planned = nn.Linear(96, 300)
    planned.weight, planned.bias = nn.Parameter(w), nn.Parameter(b)
    plan_linear(planned, {rows * 2: name})
    # fp32 products of 96 terms: rounding differs by kernel, never by more than a few ulps of the sum
    torch.testing.assert_close(planned(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert planned(x).is_contiguous()


def test_round_rows_cover_every_batch_and_proposal_length():
    assert round_rows(1, 4) == [1, 2, 3, 4, 5]
    assert round_rows(2, 1) == [1, 2, 4]


def test_a_run_plans_the_passes_a_profile_times_only_where_it_may_measure_one():
    from omegaconf import OmegaConf

    from specexp.study.run import planned_rows

    def settings(enabled, path=None):
        return OmegaConf.create({"batch_size": 2, "profile": {"enabled": enabled, "path": path}})

    assert (planned_rows(settings(False), 4) == planned_rows(settings(True, "given.json"), 4)
            == [1, 2, 3, 4, 5, 6, 8, 10])
    assert planned_rows(settings(True), 4) == round_rows(2, 8)  # T(n) up to n = 9 (PROFILED_K = 8)


@pytest.mark.parametrize("name", FORMULATIONS)
def test_a_planned_target_decodes_exactly_as_before(name, prompts):
    """Every Linear forced to one formulation: the same greedy tokens, alone and speculative,
    batched and ragged; the tied weights stay the same Parameters."""
    target = tiny_model(0, layers=2)
    alone = generate(target.model, prompts, None, SamplingConfig(), 16, [10**6], torch.Generator().manual_seed(0))
    planned, other = tiny_model(0, layers=2), tiny_model(1, layers=1)
    drafters = [None, make_drafter("disagree", planned, other, 3, {}),
                make_drafter("early_exit_shared", planned, other, 2, {}),
                make_drafter("target_prefix", planned, other, 2, {})]
    weights = {id(m.weight) for m in linear_modules(planned.model)}
    for drafter in drafters:  # in place, after the drafts were built: their references see the plan
        for module in (m for model in [planned.model, *draft_models(drafter)] for m in linear_modules(model)):
            plan_linear(module, dict.fromkeys(range(1, 65), name))
    assert {id(m.weight) for m in linear_modules(planned.model)} == weights
    assert all(m.matmul_plan[1] == name for m in linear_modules(planned.model))
    # a small LM; the exit head (made of the target's modules)
    assert [len(draft_models(d)) for d in drafters] == [0, 1, 1, 1]
    for drafter in drafters:
        out = generate(planned.model, prompts, drafter, SamplingConfig(), 16, [10**6], torch.Generator().manual_seed(0))
        assert out.tokens == alone.tokens


def test_the_plan_is_measured_once_per_machine_then_read(tmp_path, monkeypatch):
    calls = []
    real = matmul.time_formulations
    monkeypatch.setattr(matmul, "time_formulations",
                        lambda w, m, repeats=7, copies=None: calls.append((shape_key(w), m)) or real(w, m, 2, copies))
    target = tiny_model(0, layers=1).model.float()
    record = apply_plan(target, MatmulPlans(tmp_path, torch.device("cpu")), [1, 2, 3])
    shapes = {shape_key(m.weight) for m in linear_modules(target)}
    assert len(calls) == 3 * len(shapes) and set(record["choices"]) == shapes
    assert all(set(c) == {1, 2, 3} and set(c.values()) <= set(FORMULATIONS) for c in record["choices"].values())
    saved = json.loads(Path(record["plan_file"]).read_text())
    assert saved["fingerprint"] == record["fingerprint"] and saved["fingerprint"]["cpu"]
    assert all(set(saved["timings"][key]["1"]) == set(FORMULATIONS) for key in shapes)
    # A second model of the same shapes reads the plan; only rows not yet measured are timed.
    calls.clear()
    again = apply_plan(tiny_model(1, layers=1).model.float(), MatmulPlans(tmp_path, torch.device("cpu")), [1, 2, 3, 4])
    assert sorted(calls) == sorted((key, 4) for key in shapes)
    assert {k: {m: c for m, c in v.items() if m < 4} for k, v in again["choices"].items()} == record["choices"]


def test_a_formulation_far_slower_at_screening_is_timed_no_further():
    calls = {"quick": 0, "close": 0, "slow": 0}

    def taking(name, seconds):
        def fn(x, w):
            calls[name] += 1
            time.sleep(seconds)
            return x @ w.T
        return fn

    # "close" is as quick as "quick" (its fastest call within 1.25x of the best median); "slow" takes 3x as long
    candidates = {"quick": taking("quick", 0.03), "close": taking("close", 0.03), "slow": taking("slow", 0.1)}
    medians = matmul.time_formulations(torch.zeros(4, 4), 1, repeats=5, copies=[torch.zeros(4, 4)] * 2,
                                       screen=2, margin=1.25, formulations=candidates)
    assert set(medians) == {"quick", "close"} and calls == {"quick": 6, "close": 6, "slow": 3}  # warm-up + turns
    assert 0.03 <= medians["quick"] < 0.1


def test_runtime_settings_are_checked_and_recorded(tmp_path, monkeypatch):
    from specexp.errors import UserInputError
    from specexp.models import LoadedModel

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    with pytest.raises(UserInputError, match="runtime.max_planned_rows=0 is not allowed"):
        HFRuntime(max_planned_rows=0)
    target = LoadedModel(tiny_model(0, layers=1).model.float(), None, "tiny")
    unplanned = HFRuntime(matmul_plan=False).prepare(target, None, [1, 2])
    assert unplanned.record == {"name": "hf", "matmul_plan": False, "max_planned_rows": 64, "draft_int8_linears": 0}
    assert unplanned.forward is target.model
    assert not any(hasattr(m, "matmul_plan") for m in linear_modules(target.model))
    draft = make_drafter("disagree", target, LoadedModel(tiny_model(1, layers=1, hidden=48).model.float(), None, "d"),
                         2, {})
    record = HFRuntime(max_planned_rows=2).prepare(target, draft, [1, 2, 3]).record
    assert all(set(c) == {1, 2} for c in record["choices"].values())  # 3 rows: F.linear, unplanned
    assert {"96x48:float32", "64x32:float32"} <= set(record["choices"])  # the draft's shapes and the target's
    assert all(hasattr(m, "matmul_plan") for m in linear_modules(draft.draft.model))
    assert all(hasattr(m, "matmul_plan") for m in draft.forward_model.linears())  # its lean decoder's fused ones too
    assert (tmp_path / "plans").is_dir()


def test_the_lean_runtime_runs_the_target_through_its_planned_decoder(tmp_path, monkeypatch, prompts):
    from specexp.models import LoadedModel

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    target = LoadedModel(tiny_model(0, layers=2).model.float(), None, "tiny")
    reference = generate(target.model, prompts, None, SamplingConfig(), 12, [10**6], torch.Generator().manual_seed(0))
    prepared = LeanRuntime(fuse_projections=True).prepare(target, None, [1, 2])
    assert prepared.forward is lean_decoder(target.model)
    assert prepared.record["name"] == "lean" and prepared.record["fuse_projections"]
    assert all(m.matmul_plan.keys() == {1, 2} for m in prepared.forward.linears())  # fused q/k/v, gate/up, head, ...
    assert "64x32:float32" in prepared.record["choices"]  # fused gate/up: 2 x 32 rows
    out = generate(prepared.forward, prompts, None, SamplingConfig(), 12, [10**6], torch.Generator().manual_seed(0))
    assert out.tokens == reference.tokens


def test_fuse_projections_auto_keeps_what_the_timed_pass_prefers(tmp_path, monkeypatch, prompts):
    from specexp.errors import UserInputError
    from specexp.models import LoadedModel

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    target = LoadedModel(tiny_model(0, layers=2).model.float(), None, "tiny")
    reference = generate(target.model, prompts, None, SamplingConfig(), 12, [10**6], torch.Generator().manual_seed(0))
    decoder = lean_decoder(target.model)
    for fused_cost, pays in ((1.0, True), (3.0, False)):  # a clock that charges each state its own time per pass
        now = [0.0]

        def clock(fused_cost=fused_cost, now=now):
            now[0] += fused_cost if decoder.layers[0].qkv is not None else 2.0
            return now[0]

        assert lean.fusion_pays(decoder, [1, 2], clock=clock) is pays  # it follows the timings of both states
        assert decoder.layers[0].qkv is not None  # and the fused state is back
    monkeypatch.setattr(lean, "fusion_pays", lambda decoder, rows: False)
    prepared = LeanRuntime().prepare(target, None, [1, 2])
    assert not prepared.record["fuse_projections"] and prepared.record["fuse_setting"] == "auto"
    assert all(w.qkv is None and w.gate_up is None for w in prepared.forward.layers)
    out = generate(prepared.forward, prompts, None, SamplingConfig(), 12, [10**6], torch.Generator().manual_seed(0))
    assert out.tokens == reference.tokens
    # measured once per machine: a second run reads the answer from the plan file
    monkeypatch.setattr(lean, "fusion_pays", lambda decoder, rows: pytest.fail("measured again"))
    again = LeanRuntime().prepare(LoadedModel(tiny_model(1, layers=2).model.float(), None, "tiny-1"), None, [1, 2])
    assert not again.record["fuse_projections"]
    with pytest.raises(UserInputError,
                       match="runtime.fuse_projections=sometimes is not allowed; use true, false or auto"):
        LeanRuntime(fuse_projections="sometimes")


def test_the_lean_runtime_falls_back_to_transformers_for_other_architectures(tmp_path, monkeypatch, caplog):
    from transformers import GemmaConfig, GemmaForCausalLM

    from specexp.models import LoadedModel

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    config = GemmaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    target = LoadedModel(GemmaForCausalLM(config).eval(), None, "tiny-gemma")
    prepared = LeanRuntime(matmul_plan=False).prepare(target, None, [1])
    assert prepared.forward is target.model
    assert prepared.record["name"] == "hf" and "model_type 'gemma'" in prepared.record["fallback_reason"]
    assert "runtime=lean cannot run tiny-gemma" in caplog.text


@pytest.mark.default_target
def test_a_study_records_its_runtime_and_plan(tmp_path):
    run_dir = tmp_path / "run"
    out = run_specexp("size=smoke", "data.limit=1", "max_new_tokens=8", "draft.k=2", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    runtime = summary["runtime"]
    assert runtime["name"] == "lean" and runtime["matmul_plan"] and runtime["fingerprint"]["cpu"]
    assert "49152x576:float32" in runtime["choices"] and set(runtime["choices"]["49152x576:float32"]) == {
        str(n) for n in range(1, 10)}  # every pass a profile times (K up to 8)
    assert "960x576:float32" in runtime["choices"]  # the fused q/k/v projection
    assert summary["greedy_match"] == 1.0
