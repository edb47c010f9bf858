"""runtime.compile=true: the compiled pass decodes exactly as the eager lean decoder and as
transformers' forward (CPU inductor here; CUDA graphs in the gpu-marked test)."""

import pytest
import torch
from torch._dynamo.utils import counters

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.runtime.compiled import (
    CAPACITY_STEP,
    CompiledDecoder,
    bucket,
    full_capacity_mask,
    full_pass,
    held_capacity,
)
from specexp.runtime.decoder import lean_decoder
from specexp.runtime.lean import LeanRuntime
from tests.conftest import tiny_model
from tests.drafters import ScriptedK, make_drafter

NO_EOS = [10**6]
GREEDY = SamplingConfig()
COMPILED_CALL = CompiledDecoder.__call__


def decode(forward, target, prompts, k):
    drafter = PromptLookupDrafter(target, k=k) if k else None
    return generate(forward, prompts, drafter, SamplingConfig(), 20, NO_EOS, torch.Generator().manual_seed(0))


# Ragged prompts (left padding) with repeats (prompt lookup proposes from the first round), at most 4
# tokens: the prompt pass shares the rounds' buckets, 3 graphs to compile (each ~6 s cold on a Zen 5 core)
SHORT_PROMPTS = [[2, 3, 2, 3], [4, 5, 6], [7, 7]]


def test_compiled_passes_decode_exactly_as_transformers(tmp_path, monkeypatch):
    """Ragged batch of 3 with prompt lookup (passes of 1..4 tokens, 3-token ones padded to 4, per-row
    rewinds) and AR, on the decoder's held cache (the AR decode reuses the spec decode's buffers,
    cleared); the graphs warmed first leave nothing to compile inside the decodes."""
    prompts = SHORT_PROMPTS
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    pass_sizes = []  # new tokens per pass, as the engine asks (before padding to a bucket)

    def counted(self, input_ids, *args, **kwargs):
        pass_sizes.append(input_ids.shape[1])
        return COMPILED_CALL(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(CompiledDecoder, "__call__", counted)
    target = LoadedModel(tiny_model(0, layers=2).model.float(), None, "tiny")
    prepared = LeanRuntime(compile=True).prepare(target, None, [1, 2, 3, 4])
    assert prepared.record["compile"] and prepared.record["compile_mode"] == "default"
    longest = max(map(len, prompts))  # the left-padded prompt pass's
    capacity = longest + 20 + 3 + 1  # the longest decode's booking (k = 3)
    assert prepared.forward.warm([3], [*range(1, 5), longest], capacity,
                                 [full_pass(2)]) == len({1, 2, 4, bucket(longest)})
    with torch.inference_mode():  # as the engine asks for it (warm made its buffers there)
        held = prepared.forward.held_cache(3, capacity, torch.device("cpu"))
    graphs = counters["stats"]["unique_graphs"]
    for k in (3, 0):
        assert decode(prepared.forward, target, prompts, k).tokens == decode(target.model, target, prompts, k).tokens
    assert counters["stats"]["unique_graphs"] == graphs  # no compile inside a decode
    # every pass compiled, one padded
    assert prepared.forward.compiled_passes == len(pass_sizes) > 20 and 3 in pass_sizes
    with torch.inference_mode():
        assert prepared.forward.held_cache(3, capacity, torch.device("cpu")).keys.data_ptr() == held.keys.data_ptr()


def test_held_caches_keep_their_buffers_and_grow_when_a_decode_needs_more():
    decoder = LeanRuntime(compile=True, matmul_plan=False).target_forward(
        LoadedModel(tiny_model(0, layers=2).model.float(), None, "tiny"))[0]
    cpu = torch.device("cpu")
    assert held_capacity(1, 32) == CAPACITY_STEP and held_capacity(CAPACITY_STEP - 32 + 1, 32) == 2 * CAPACITY_STEP
    first = decoder.held_cache(1, 100, cpu)
    first.forward(decoder.decoder, torch.tensor([[5, 6, 7]]))  # eagerly: books 3 slots
    again = decoder.held_cache(1, 200, cpu)  # fits: the same buffers, holding nothing
    assert again is first and again.length == 0 and not again.valid.any() and again.capacity == CAPACITY_STEP
    grown = decoder.held_cache(1, CAPACITY_STEP, cpu)  # no room for a bucket's padding past the end
    assert grown.capacity == 2 * CAPACITY_STEP and grown.keys.data_ptr() != first.keys.data_ptr()
    assert decoder.held_cache(2, 10, cpu) is not grown  # one per batch size


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
    counters.clear()
    for k in (3, 0):
        drafter = PromptLookupDrafter(target, k=k) if k else None
        g = torch.Generator(device="cuda")
        ours = generate(prepared.forward, prompts, drafter, SamplingConfig(), 20, NO_EOS, g.manual_seed(0))
        alone = generate(target.model, prompts, None, SamplingConfig(), 20, NO_EOS, g.manual_seed(0))
        assert ours.tokens == alone.tokens
    # Every compiled pass ran as a CUDA graph: cudagraph trees skip (run without graphs, silently)
    # a graph that writes into inputs whose addresses may change, the held caches' reason to be.
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert prepared.forward.compiled_passes > 20


# Every model draft: its steps compiled beside the target's passes (chains, trees, feature heads, the shared
# early exit's split passes), K changing every round (ScriptedK: feeds of every size, rounds without the draft).
COMPILED_KINDS = ["disagree", "target_prefix", "distilled_like", "small_lm_tree", "reduced_vocab_tree", "eagle",
                  "eagle3_reduced_vocab", "eagle3_int8", "eagle_tree", "eagle3_published", "eagle3_published_flags",
                  "eagle3_published_tree", "medusa", "medusa_tree_reduced_vocab", "early_exit_shared"]


def compiled_decode(target, drafter, prompts, backend: str, sampling=GREEDY, k_policy=None):
    prepared = LeanRuntime(compile=True, compile_backend=backend, matmul_plan=False).prepare(target, drafter, [1, 2, 3])
    out = generate(prepared.forward, prompts, drafter, sampling, 20, NO_EOS, torch.Generator().manual_seed(0),
                   k_policy=k_policy, compiled_settle=prepared.compiler.settle)
    return out, prepared.compiler.stats()["compiled_passes"]


@pytest.mark.parametrize("kind", COMPILED_KINDS)
def test_compiled_draft_steps_decode_greedily_as_the_target_alone(target, other_draft, prompts, ngram_files, kind):
    """backend=eager: dynamo's capture of every kind of step (static shapes, the full-capacity masks, the
    writes into the held caches), without code generation; the inductor test below generates code."""
    alone = generate(lean_decoder(target.model), prompts, None, GREEDY, 20, NO_EOS, torch.Generator().manual_seed(0))
    drafter = make_drafter(kind, target, other_draft, 4, ngram_files)
    out, passes = compiled_decode(target, drafter, prompts, "eager", k_policy=ScriptedK(seed=len(kind)))
    assert out.tokens == alone.tokens
    assert passes["target"] > 0 and passes["draft"] > 0 and passes["verify"] > 0, passes


def test_compiled_draft_steps_under_inductor_decode_as_the_target_alone(target, other_draft, prompts, ngram_files):
    """An EAGLE head's layer and logits and the target's passes that return its features, as generated code."""
    alone = generate(lean_decoder(target.model), prompts, None, GREEDY, 20, NO_EOS, torch.Generator().manual_seed(0))
    out, passes = compiled_decode(target, make_drafter("eagle", target, other_draft, 3, ngram_files), prompts,
                                  "inductor")
    assert out.tokens == alone.tokens and passes["target"] > 10 and passes["draft"] > 30, passes
