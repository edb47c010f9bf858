"""Int8 draft weights: the linears match their dequantized weights, and nothing else changes."""

import json

import pytest
import torch
from torch import nn

from specexp.drafts.parts.quantize import Int8WeightLinear, int8_per_channel, quantize_linears, resolve_quantize
from specexp.errors import UserInputError
from tests.conftest import tiny_model


def test_per_channel_int8_round_trips_within_half_a_step():
    weight = torch.randn(24, 48) * torch.logspace(-2, 1, 24)[:, None]  # rows of very different scales
    q, scales = int8_per_channel(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert bool(((q.float() * scales[:, None] - weight).abs() <= scales[:, None] / 2 + 1e-7).all())


@pytest.mark.parametrize("shape", [(3, 32), (2, 5, 64)])
def test_int8_linear_matches_its_dequantized_weights(shape):
    torch.manual_seed(0)
    linear = nn.Linear(shape[-1], 40, bias=False)
    x = torch.randn(*shape)
    q, scales = int8_per_channel(linear.weight)
    expected = x @ (q.float() * scales[:, None]).T  # [..., 40]
    out = Int8WeightLinear(linear)(x)
    assert out.shape == (*shape[:-1], 40) and out.dtype == x.dtype
    # bf16 activations and scales: ~3 significant digits
    assert float((out - expected).abs().max()) <= 2e-2 * float(expected.abs().max())


def test_quantize_copies_and_skips_layers_the_kernel_cannot_take():
    draft = tiny_model(3, layers=1)
    model = draft.model
    model.model.layers[0].mlp.down_proj = nn.Linear(64, 32, bias=True).double()  # a bias: left as it is
    quantized = quantize_linears(model, "int8")
    assert isinstance(quantized.lm_head, Int8WeightLinear)
    assert isinstance(quantized.model.layers[0].self_attn.q_proj, Int8WeightLinear)
    assert type(quantized.model.layers[0].mlp.down_proj) is nn.Linear
    assert type(model.lm_head) is nn.Linear  # the original's modules are untouched, its tensors shared, not copied
    assert quantized.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert quantized.model.layers[0].mlp.down_proj.weight is model.model.layers[0].mlp.down_proj.weight
    assert quantize_linears(model, None) is model
    odd = nn.Sequential(nn.Linear(24, 8, bias=False))  # in_features % 16 != 0: the kernel gives NaN there
    assert type(quantize_linears(odd, "int8")[0]) is nn.Linear


def test_quantized_draft_predicts_like_the_original():
    draft = tiny_model(4, layers=2, vocab_size=64, hidden=64, scale=3.0)
    x = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = draft.model(x).logits
        int8 = quantize_linears(draft.model, "int8")(x).logits
    assert float((full.argmax(-1) == int8.argmax(-1)).double().mean()) >= 0.9


def test_auto_quantizes_the_shapes_this_machine_measured_faster_in_int8(tmp_path, monkeypatch):
    """The plan times the int8 kernel beside the fp32 formulations (once, into the plan file);
    auto turns exactly the shapes where int8 won into int8 layers."""
    from specexp.runtime import matmul

    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    monkeypatch.setattr(matmul, "time_formulations",
                        lambda w, m, repeats=7, copies=None: dict.fromkeys(matmul.FORMULATIONS, 1.0))
    monkeypatch.setattr(matmul, "time_int8", lambda w, m, repeats=7: 0.5 if w.shape[0] == 64 else 2.0)
    model = tiny_model(3, layers=1, hidden=32).model.float()  # lm_head [64 x 32]; the layer's [32 x 32], [64 x 32], ...
    quantized = quantize_linears(model, "auto")
    assert isinstance(quantized.lm_head, Int8WeightLinear) and isinstance(quantized.model.layers[0].mlp.up_proj,
                                                                          Int8WeightLinear)
    assert type(quantized.model.layers[0].self_attn.q_proj) is nn.Linear  # [32 x 32]: fp32 measured faster
    plan = json.loads(next((tmp_path / "plans").glob("matmul-*.json")).read_text())
    assert plan["int8"]["64x32:float32"]["1"] == 0.5
    monkeypatch.setattr(matmul, "time_int8", lambda w, m, repeats=7: 2.0)
    slower = tiny_model(3, layers=1, hidden=16).model.float()  # new shapes, int8 slower for all: left as it is
    assert quantize_linears(slower, "auto") is slower


def test_auto_is_measured_on_a_cpu_only_and_bad_schemes_are_one_line_errors():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_quantize("auto", cpu) == "auto" and resolve_quantize("auto", cuda) is None
    assert resolve_quantize(None, cuda) is None and resolve_quantize("int8", cpu) == "int8"
    with pytest.raises(UserInputError, match="draft.quantize=int4 is not allowed; use null or one of int8, auto"):
        resolve_quantize("int4", cpu)
    with pytest.raises(UserInputError, match="runs on a CPU kernel only; the draft is on cuda"):
        resolve_quantize("int8", cuda)
