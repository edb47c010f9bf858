"""A Gemma3-shaped target (the second family's architecture, tiny and random, sliding layers of a
4-position window) through the engine: greedy output identical to the target alone for the drafts
made of its own layers and for prompt lookup, on the lean runtime and on transformers' forward,
with contexts far past the window and ragged rows."""

import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.early_exit import early_exit_drafter
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.small_lm import target_prefix_drafter
from specexp.runtime.decoder import lean_decoder, unsupported_reason
from tests.conftest import tiny_gemma3

NO_EOS = [10**6]
DRAFTS = {
    "early_exit_shared": lambda target: early_exit_drafter(target, exit_layer=1, k=3, mode="shared"),
    "early_exit_naive": lambda target: early_exit_drafter(target, exit_layer=2, k=3, mode="naive"),
    "target_prefix": lambda target: target_prefix_drafter(target, n_layers=2, k=4),
    "prompt_lookup": lambda target: PromptLookupDrafter(target, k=3),
}


@pytest.fixture(scope="module")
def gemma3_target():
    target = tiny_gemma3(5)
    assert unsupported_reason(target.model) is None  # the lean runtime takes it
    return target


@pytest.fixture(scope="module")
def transformers_greedy(gemma3_target, prompts):
    """transformers' own generate, one prompt at a time (its sliding-window cache): the reference."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            new = gemma3_target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                               min_new_tokens=40, do_sample=False, pad_token_id=0)
            out.append(new[0, len(prompt):].tolist())
    return out


@pytest.mark.parametrize("runtime", ["lean", "hf"])
@pytest.mark.parametrize("draft", sorted(DRAFTS))
def test_greedy_output_is_the_gemma3_target_s(gemma3_target, prompts, transformers_greedy, draft, runtime):
    forward = lean_decoder(gemma3_target.model) if runtime == "lean" else gemma3_target.model
    spec = generate(forward, prompts, DRAFTS[draft](gemma3_target), SamplingConfig(), 40, NO_EOS,
                    torch.Generator().manual_seed(0))
    assert spec.tokens == transformers_greedy
    assert int(spec.n_accepted.sum()) > 0  # the drafts were put to the target, and some held
