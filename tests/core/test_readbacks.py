"""The host reads the device back once per round: a chain round (every model draft and the oracle,
greedy and sampled, K fixed and draft.k=auto) and an AR round read it back at most once, one packed
transfer (core/readbacks.read_back); the drafts that match on the host keep what the bounds below
say. Counted on the CPU by core/readbacks.ReadbackCounter (every read of a tensor's values, which is
a device synchronisation on a GPU), per round in steady state: the readbacks of a 24-token decode
less those of an 8-token one, over the rounds between them. The gpu-marked test counts CUDA's own
synchronisations (torch.cuda.set_sync_debug_mode)."""

import warnings

import numpy as np
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.readbacks import ReadbackCounter, read_back
from specexp.core.sampling import SamplingConfig
from specexp.drafts.oracle import OracleDrafter
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.k_policy.priced import PricedK
from specexp.k_policy.tree import PricedTreeK
from specexp.models import LoadedModel
from specexp.runtime.decoder import lean_decoder
from specexp.study.references import greedy_continuations
from tests.conftest import noisy_copy, tiny_model
from tests.drafters import DRAFT_KINDS, make_drafter

K = 3
NO_EOS = [10**6]
SAMPLINGS = {"greedy": SamplingConfig(), "t1": SamplingConfig(temperature=1.0)}
WALK = 2  # a tree's verify walks it node by node: its depth and which nodes have later siblings
# What the drafts that do not keep to one readback per round read on top of it, and why.
EXTRA = {
    "prompt_lookup_tree": WALK,
    "eagle_tree": WALK,
    "eagle3_published_tree": WALK,
    "medusa_tree_reduced_vocab": WALK,
    # and the draft's cache: how many expanded nodes each row kept (its rewind, and the next feed)
    "small_lm_tree": WALK + 2,
    "reduced_vocab_tree": WALK + 2,
    # min_confidence: whether any row still drafts, once per draft step (a round of stopped rows ends early)
    "small_lm_confident": K,
    "distilled_like": K,
    # an n-gram LM on the host: each drafted token, for the next context (a tree: each level's nodes)
    "ngram_lm": K,
    "ngram_lm_confident": K,
    "ngram_lm_tree": 3 * K,
}
RETRIEVAL = ("retrieval", "retrieval+context", "retrieval_confident")  # a host walk of the datastore, per row and token
CHAIN_MODEL_DRAFTS = [kind for kind in DRAFT_KINDS if kind not in EXTRA and kind not in RETRIEVAL]


def priced(drafter, k: int):
    """draft.k=auto's policy with prices under which drafting pays."""
    seconds = 0.01 * (1 + 0.05 * np.arange(k + 1))
    draft_seconds = np.r_[0.0, np.full(k, 1e-4)]
    if drafter.traits.grows_trees:
        return PricedTreeK(lambda context: seconds, draft_seconds)
    return PricedK(lambda context: seconds, draft_seconds, free_groups=drafter.traits.proposal_groups)


def readbacks_per_round(forward, prompts, drafter, sampling: SamplingConfig, auto: bool) -> tuple[int, dict]:
    """The most readbacks any round of a 24-token decode made, and where they all came from."""
    policy = priced(drafter, K) if auto and drafter is not None else None
    with ReadbackCounter() as counter:
        generate(forward, prompts, drafter, sampling, 24, NO_EOS, torch.Generator().manual_seed(0), k_policy=policy)
    return max(counter.per_round()), counter.where()


@pytest.fixture(scope="module")
def lean_target(target):
    return lean_decoder(target.model)  # the runtime a study runs (transformers' forward reads back inside)


@pytest.mark.parametrize("auto", [False, True], ids=["k_fixed", "k_auto"])
@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("kind", CHAIN_MODEL_DRAFTS)
def test_a_chain_round_reads_the_device_back_once(lean_target, target, other_draft, prompts, ngram_files, kind,
                                                  sampling_name, auto):
    drafter = make_drafter(kind, target, other_draft, K, ngram_files)  # built outside the count: loading reads
    per, where = readbacks_per_round(lean_target, prompts, drafter, SAMPLINGS[sampling_name], auto)
    assert per <= 1, f"{kind}: a round read the device back {per} times; where: {where}"


@pytest.mark.parametrize("kind", [*EXTRA, *RETRIEVAL])
def test_drafts_that_read_more_keep_to_their_stated_bound(lean_target, target, other_draft, prompts, ngram_files, kind):
    drafter = make_drafter(kind, target, other_draft, K, ngram_files)
    per, where = readbacks_per_round(lean_target, prompts, drafter, SAMPLINGS["greedy"], auto=False)
    bound = 1 + (2 * len(prompts) * K if kind in RETRIEVAL else EXTRA[kind])
    assert per <= bound, (f"{kind}: a round read the device back {per} times, more than its bound {bound}; "
                          f"where: {where}")


def test_an_ar_round_and_the_oracles_read_the_device_back_once(lean_target, target, prompts):
    assert readbacks_per_round(lean_target, prompts, None, SAMPLINGS["greedy"], False)[0] <= 1
    oracle = OracleDrafter(target, alpha=0.7, k=K, cost_layers=1, cost_hidden=32)
    oracle.set_reference(prompts, greedy_continuations(lean_target, target, prompts, 24, len(prompts)))
    for auto in (False, True):
        per, where = readbacks_per_round(lean_target, prompts, oracle, SAMPLINGS["greedy"], auto)
        assert per <= 1, f"oracle: a round read the device back {per} times; where: {where}"


def test_the_counter_counts_each_kind_of_read_once():
    t = torch.tensor([1, 2, 3])
    reads = [lambda: bool(t.any()), lambda: int(t[0]), lambda: t.sum().item(), lambda: t.tolist(),
             lambda: t.cpu().numpy(), lambda: t[t > 1], lambda: t.nonzero(), lambda: torch.equal(t, t),
             lambda: [0, 1, 2, 3][t[0]], lambda: read_back(a=t, b=t > 1)]
    for read in reads:
        with ReadbackCounter() as counter, torch.inference_mode():  # inference tensors too
            read()
        assert len(counter) == 1, counter.where()
    with ReadbackCounter() as counter:
        (t + 1)[0:2].max()  # no value reaches the host
    assert len(counter) == 0
    assert torch.Tensor.tolist(t) == [1, 2, 3]  # restored


def cuda_syncs(forward, prompts, drafter, max_new: int) -> tuple[int, int]:
    """A greedy decode's rounds and the synchronisations CUDA warned of (torch.cuda.set_sync_debug_mode)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = generate(forward, prompts, drafter, SamplingConfig(), max_new, NO_EOS,
                           torch.Generator("cuda").manual_seed(0))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return len(out.k_chosen), sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rounds_synchronise_once(prompts):
    """On CUDA the rounds of a small-LM chain and of AR synchronise once each, by CUDA's own count: the
    synchronisations of a 24-token decode less an 8-token one's, over the rounds between them."""
    target = tiny_model(0, layers=2, dtype=torch.float32)
    target = LoadedModel(target.model.to("cuda"), None, target.name)
    forward = lean_decoder(target.model)
    for drafter in (None, SmallLMDrafter(target, noisy_copy(target, noise=0.5, seed=1), k=K)):
        (few_rounds, few), (many_rounds, many) = (cuda_syncs(forward, prompts, drafter, n) for n in (8, 24))
        assert (many - few) / (many_rounds - few_rounds) <= 1.0
