"""runtime.compile=true: the compiled pass decodes exactly as the eager lean decoder and as
transformers' forward (CPU inductor here; CUDA graphs in the gpu-marked test)."""

import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.runtime import LeanRuntime
from specexp.runtime.compiled import bucket, full_capacity_mask
from tests.conftest import tiny_model

NO_EOS = [10**6]


def decode(forward, target, prompts, k):
    drafter = PromptLookupDrafter(target, k=k) if k else None
    return generate(forward, prompts, drafter, SamplingConfig(), 20, NO_EOS, torch.Generator().manual_seed(0))


def test_compiled_passes_decode_exactly_as_transformers(prompts, tmp_path, monkeypatch):
    """Ragged batch of 3 with prompt lookup (passes of 1..4 tokens, per-row rewinds) and AR."""
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    target = LoadedModel(tiny_model(0, layers=2).model.float(), None, "tiny")
    prepared = LeanRuntime(compile=True).prepare(target, None, [1, 2, 3, 4])
    assert prepared.record["compile"] and prepared.record["compile_mode"] == "default"
    for k in (3, 0):
        assert decode(prepared.forward, target, prompts, k).tokens == decode(target.model, target, prompts, k).tokens
    assert prepared.forward.compiled_passes > 20  # the rounds ran compiled; only the prompt passes ran eagerly


def test_full_capacity_mask_sees_valid_slots_up_to_each_query():
    valid = torch.tensor([[1, 1, 0, 1, 1, 0], [0, 0, 0, 1, 1, 0]])  # [B, C]: slots 3, 4 are the new ones
    mask = full_capacity_mask(valid, torch.tensor([3, 4]))  # [B, 1, T, C]
    assert mask[0, 0].tolist() == [[True, True, False, True, False, False], [True, True, False, True, True, False]]
    assert mask[1, 0, 0].tolist() == [False, False, False, True, False, False]


def test_passes_are_padded_to_power_of_two_buckets():
    assert [bucket(t) for t in (1, 2, 3, 4, 5, 8, 9, 17)] == [1, 2, 4, 4, 8, 8, 16, 32]


def test_compile_settings_are_checked():
    with pytest.raises(UserInputError, match="runtime.compile_max_tokens=0 is not allowed"):
        LeanRuntime(compile=True, compile_max_tokens=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_decode_exactly_as_eager(prompts):
    target = LoadedModel(tiny_model(0, layers=2).model.to("cuda", torch.float32), None, "tiny-cuda")
    prepared = LeanRuntime(compile=True, matmul_plan=False).prepare(target, None, [1, 2, 3, 4])
    assert prepared.record["compile_mode"] == "reduce-overhead"
    for k in (3, 0):
        drafter = PromptLookupDrafter(target, k=k) if k else None
        g = torch.Generator(device="cuda")
        ours = generate(prepared.forward, prompts, drafter, SamplingConfig(), 20, NO_EOS, g.manual_seed(0))
        alone = generate(target.model, prompts, None, SamplingConfig(), 20, NO_EOS, g.manual_seed(0))
        assert ours.tokens == alone.tokens
