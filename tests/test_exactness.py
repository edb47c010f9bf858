"""End to end, sampled output is distributed as the target's: for every draft strategy, K in
{1, 3, 5}, three warps (plain T = 1, top-k and top-p actually cutting), ragged batches.

The target is a random 8-token Llama built here, so the exact probability of every 3-token
continuation (8^3 = 512 cells per prompt) is enumerated from its logits. Each test decodes
ROWS copies of each of three prompts of different lengths in one batch (left padding, rows
accepting different counts), 4 new tokens per row through the real engine, and compares the
joint of tokens 1..3 per prompt with the enumerated target (a grouped chi-square). Tokens 2
and 3 come after a round's later draft positions, its bonus token, the caches' rewinds and the
draft's update, so a mistake in any of them shows.

False failures: each test fails by chance with probability P_VALUE_THRESHOLD (1e-4). Power:
each test computes and states the smallest total-variation distance, in any one prompt's
joint, that it detects with probability 0.9 (about 0.05 here); the assertion message prints
it. `test_a_broken_residual_is_caught` runs the same cases with the residual resampled from
p instead of norm(max(p - q, 0)) and requires every one of them to fail.

The shipped `draft=distilled` (a reduced vocabulary, int8 weights) needs the default target,
whose vocabulary is too large to enumerate: its test keeps two tokens per step (top-k = 2) and
compares the 8 continuations of 3 tokens per prompt the same way, with its own broken control.
"""

import pytest
import torch

from specexp.core import engine
from specexp.core.sampling import SamplingConfig, logits_to_probs, sample
from specexp.core.tree import chain_parents
from specexp.core.verify import tree_verify
from specexp.runtime.lean import LeanRuntime
from tests.conftest import build_ngram_files, tiny_model
from tests.drafters import DRAFT_KINDS, GRID_CASE_OF_CONFIG, NOT_IN_THE_SAMPLED_GRID, make_drafter
from tests.stats import P_VALUE_THRESHOLD, detectable_tvd, exact_joint, grouped_chi_square

V = 8
ROWS = 3000  # decoded rows per prompt and test
MAX_DETECTABLE_TVD = 0.12  # every test must have at least this power (checked, not assumed)
PROMPTS = [[2, 3, 4, 2, 3, 4, 2, 3], [5, 6, 5], [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3]]
NO_EOS = [10**6]
SAMPLINGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.8_top-k3": SamplingConfig(temperature=0.8, top_k=3),
    "t1.3_top-p0.7": SamplingConfig(temperature=1.3, top_p=0.7),
}
# "agree" (the target as its own draft) never rejects, so no residual is ever drawn: it is
# covered by the greedy grid, where it must accept everything.
KINDS = [kind for kind in DRAFT_KINDS if kind != "agree"]
KS = [1, 3, 5]
# Each kind meets every K and every warp: the warp rotates with the kind's index.
CASES = [(kind, k, list(SAMPLINGS)[(i + j) % 3]) for i, kind in enumerate(KINDS) for j, k in enumerate(KS)]


def quick(i: int, j: int) -> bool:
    """CI's default run keeps one case per kind: K = KS[j] with j rotating with the kind's index
    and its index // 3, so the kinds together still meet all nine (K, warp) pairs; the others are
    `slow` (each kind's proposing at K = 1, 2, 4, 8 is also checked token for token in test_engine)."""
    return j == (i + i // 3) % 3


CI_CASES = [pytest.param(*case, marks=() if quick(n // len(KS), n % len(KS)) else pytest.mark.slow)
            for n, case in enumerate(CASES)]


def test_every_shipped_draft_is_in_the_grid():
    """The registry of drafts (conf/draft/*.yaml) against the grid: each config's card declares its case
    (a case CI runs) or why another test covers it."""
    from specexp.drafts.registry import draft_names

    assert set(draft_names()) == set(GRID_CASE_OF_CONFIG) | set(NOT_IN_THE_SAMPLED_GRID)
    assert set(GRID_CASE_OF_CONFIG.values()) <= set(DRAFT_KINDS)
    ci_kinds = {param.values[0] for param in CI_CASES if not param.marks}
    assert set(GRID_CASE_OF_CONFIG.values()) <= ci_kinds


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The 8-token target, a same-vocabulary draft model that agrees with it part of the time,
    and n-gram files built from the target's own samples."""
    # Sharp, like an LM: ~1.7 nats per token at T = 1. In float32, not conftest's float64: a
    # distribution test has no argmax ties to fear, and 9,000-row batches decode in half the time
    # (the same samples: every CI case's p-value is the float64 one's to six digits).
    target = tiny_model(20, layers=2, vocab_size=V, scale=10.0, dtype=torch.float32)
    other = tiny_model(21, layers=1, vocab_size=V, scale=10.0, dtype=torch.float32)
    return target, other, build_ngram_files(target, tmp_path_factory.mktemp("ngram8"), seed=1)


def decode_counts(target, drafter, sampling: SamplingConfig, seed: int,
                  forward=None) -> tuple[torch.Tensor, engine.GenerationOutput]:
    """ROWS copies of each prompt, interleaved in one batch, 4 new tokens each -> counts [3, V^3]
    (``forward``: the target's under a runtime; default transformers')."""
    batch = PROMPTS * ROWS
    g = torch.Generator().manual_seed(seed)
    out = engine.generate(forward or target.model, batch, drafter, sampling, 4, NO_EOS, g)
    cells = torch.tensor([(t[0] * V + t[1]) * V + t[2] for t in out.tokens])
    counts = torch.zeros(len(PROMPTS), V**3, dtype=torch.long)
    for i in range(len(PROMPTS)):
        counts[i] = torch.bincount(cells[i :: len(PROMPTS)], minlength=V**3)
    return counts, out


def check_case(pair, kind: str, k: int, sampling_name: str, build=None,
               compile_backend: str | None = None) -> tuple[float, float, engine.GenerationOutput]:
    """p-value and detectable TVD of one case, after checking the case can tell (power, cutting);
    ``build``: a draft outside DRAFT_KINDS (target, other, k, files -> drafter); ``compile_backend``:
    the target's and the draft's steps compiled (runtime.compile=true) with it."""
    target, other, files = pair
    sampling = SAMPLINGS[sampling_name]
    expected = torch.stack([exact_joint(target, p, sampling) for p in PROMPTS])  # [3, V^3]
    if sampling_name != "t1":  # the warp really cuts: some continuations become impossible
        unwarped = torch.stack([exact_joint(target, p, SamplingConfig(temperature=sampling.temperature))
                                for p in PROMPTS])
        assert bool(((expected == 0) & (unwarped > 0)).any())
    drafter = make_drafter(kind, target, other, k, files) if build is None else build(target, other, k, files)
    forward = None
    if compile_backend is not None:
        runtime = LeanRuntime(compile=True, compile_backend=compile_backend, matmul_plan=False)
        forward = runtime.prepare(target, drafter, [k + 1]).forward
    counts, out = decode_counts(target, drafter, sampling, seed=100 * (KINDS.index(kind) if kind in KINDS else 99) + k,
                                forward=forward)
    if compile_backend is not None:
        assert runtime.compiler.stats()["compiled_passes"].get("draft", 0) > 0
    p_value, dof = grouped_chi_square(counts, expected)
    return p_value, detectable_tvd(ROWS, dof), out


# One work unit, the run's largest: pytest-xdist hands it out first, so one worker decodes the grid (tiny
# models only) while the next converts the default target and makes its matmul plan, instead of waiting
# on their lock (a run with empty caches: ~25 s of one worker).
@pytest.mark.xdist_group("exactness_grid")
@pytest.mark.parametrize(("kind", "k", "sampling_name"), CI_CASES)
def test_sampled_tokens_1_to_3_follow_the_target(pair, kind, k, sampling_name):
    assert_follows_the_target(pair, kind, k, sampling_name)


def assert_follows_the_target(pair, kind: str, k: int, sampling_name: str, build=None) -> None:
    """The grid's case (``build``: a draft outside DRAFT_KINDS, as check_case takes it)."""
    p_value, tvd, out = check_case(pair, kind, k, sampling_name, build)
    assert tvd <= MAX_DETECTABLE_TVD, f"too few rows: this case only detects a TVD >= {tvd:.3f}"
    assert p_value > P_VALUE_THRESHOLD, (
        f"{kind} K={k} {sampling_name}: tokens 1..3 do not follow the target (p = {p_value:.2e}; "
        f"this test detects a TVD >= {tvd:.3f} in a prompt's joint with probability 0.9)"
    )
    assert int(out.n_accepted.sum()) > 0, f"{kind} had no token accepted: the draft path was not exercised"


def verify_with_broken_residual(draft_tokens, parents, draft_probs, target_probs, generator=None):
    """The rule with a classic bug: after a rejection, draw the next token from p, not from
    norm(max(p - q, 0)). Accepted paths and bonus tokens are unchanged. A rejection is where the
    last accepted node (or the tip) has drafted children; p is the target's there."""
    path, n_accepted, next_token = tree_verify(draft_tokens, parents, draft_probs, target_probs, generator)
    if parents is None:  # a chain
        parents = chain_parents(*draft_tokens.shape, draft_tokens.device)
    rows = torch.arange(draft_tokens.shape[0])
    tip_then_path = torch.cat([torch.full_like(n_accepted[:, None], -1), path], dim=1)  # [B, D+1]
    last = tip_then_path.gather(1, n_accepted[:, None])[:, 0]  # the last accepted node, -1: the tip
    rejected = ((parents == last[:, None]) & (draft_probs.sum(-1) > 0)).any(1)
    from_p = sample(target_probs[rows, last + 1], generator)  # target_probs[:, 0] is the tip's, [:, 1 + i] node i's
    return path, n_accepted, torch.where(rejected, from_p, next_token)


@pytest.mark.parametrize(("kind", "k", "sampling_name", "backend"), [
    ("disagree", 3, "t0.8_top-k3", "inductor"), ("eagle_tree", 3, "t1.3_top-p0.7", "eager"),
    ("early_exit_shared", 3, "t1", "eager"), ("medusa", 3, "t1", "eager")])
def test_compiled_draft_steps_sample_the_target(pair, kind, k, sampling_name, backend):
    """runtime.compile=true: the same test with the target's and the draft's steps compiled (inductor's
    generated code for a small LM; dynamo's capture alone for the others, tests/runtime/test_compiled.py)."""
    p_value, tvd, _ = check_case(pair, kind, k, sampling_name, compile_backend=backend)
    assert p_value > P_VALUE_THRESHOLD, (f"{kind} K={k} {sampling_name} compiled: p = {p_value:.2e} "
                                         f"(detects TVD >= {tvd:.3f})")


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "k", "sampling_name"), CASES)
def test_a_broken_residual_is_caught(pair, kind, k, sampling_name, monkeypatch):
    """The control: every case above must fail against the broken rule (else it has no power
    over the residual)."""
    monkeypatch.setattr(engine, "tree_verify", verify_with_broken_residual)
    p_value, tvd, _ = check_case(pair, kind, k, sampling_name)
    assert p_value < P_VALUE_THRESHOLD, f"{kind} K={k} {sampling_name}: the broken residual passed (p = {p_value:.3f})"


@pytest.mark.parametrize(("kind", "k", "sampling_name"), [("disagree", 3, "t1"), ("prompt_lookup", 5, "t0.8_top-k3"),
                                                          ("retrieval+context", 1, "t1.3_top-p0.7")])
def test_a_broken_residual_is_caught_quick(pair, kind, k, sampling_name, monkeypatch):
    """A few cases of the control above, in the default run."""
    test_a_broken_residual_is_caught(pair, kind, k, sampling_name, monkeypatch)


@pytest.mark.parametrize(("kind", "k", "sampling_name"), [("small_lm_tree", 5, "t1.3_top-p0.7"),
                                                          ("reduced_vocab_tree", 5, "t1")])
def test_tree_siblings_priced_as_iid_draws_are_caught(pair, kind, k, sampling_name, monkeypatch):
    """The control for dynamic trees: siblings drawn without replacement but handed to the rule
    with their parent's q (as if drawn i.i.d.) must fail the same test (by hand: p ~ 1e-69, 1e-129)."""
    from specexp.drafts.parts import dynamic_tree

    draw = dynamic_tree.draw_children

    def iid_priced(raw, q, n, sampling, generator):
        tokens, probs, drawn = draw(raw, q, n, sampling, generator)
        return tokens, q[:, :, None].expand_as(probs) * (probs.sum(-1, keepdim=True) > 0), drawn

    monkeypatch.setattr(dynamic_tree, "draw_children", iid_priced)
    p_value, _, _ = check_case(pair, kind, k, sampling_name)
    assert p_value < P_VALUE_THRESHOLD, (f"{kind} K={k} {sampling_name}: i.i.d.-priced siblings passed "
                                         f"(p = {p_value:.3f})")


# The shipped distilled draft on the default target: its vocabulary is too large to enumerate,
# so top-k = 2 keeps two tokens per step (8 continuations of 3 tokens per prompt).
DEFAULT_TARGET_ROWS = 300
TOP2 = SamplingConfig(temperature=1.0, top_k=2)


@pytest.fixture(scope="module")
def default_pair():
    from hydra import compose, initialize_config_dir

    from specexp.drafts.build import build_draft
    from specexp.models.embedded import load_embedded_target
    from specexp.paths import CONFIG_DIR

    target = load_embedded_target("float32", "cpu")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["draft=distilled", "draft.k=2", "dtype=float32"])
    prompts = [target.tokenizer(text)["input_ids"] for text in ("The capital of France is", "Once upon a time",
                                                                 "def fibonacci(n):\n    ")]
    return target, lambda t: build_draft(cfg.draft, t).drafter, prompts


@torch.no_grad()
def exact_top2_joint(target, prompt: list[int]) -> dict[tuple[int, int, int], float]:
    """P(t1, t2, t3 | prompt) under the top-2 warp, over the continuations it allows."""
    def probs(ids):
        return logits_to_probs(target.model(torch.tensor([ids])).logits[0, -1], TOP2)

    joint, p1 = {}, probs(prompt)
    for a in p1.nonzero().flatten().tolist():
        p2 = probs(prompt + [a])
        for b in p2.nonzero().flatten().tolist():
            p3 = probs(prompt + [a, b])
            for c in p3.nonzero().flatten().tolist():
                joint[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return joint


def check_shipped_distilled(default_pair) -> tuple[float, float]:
    target, make_drafter_for, prompts = default_pair
    joints = [exact_top2_joint(target, p) for p in prompts]
    cells = sorted(set().union(*joints))
    expected = torch.tensor([[joint.get(c, 0.0) for c in cells] for joint in joints])  # [3, C]
    out = engine.generate(target.model, prompts * DEFAULT_TARGET_ROWS, make_drafter_for(target), TOP2, 4, NO_EOS,
                          torch.Generator().manual_seed(0))
    assert int(out.n_accepted.sum()) > 0
    index = {c: i for i, c in enumerate(cells)}
    counts = torch.zeros(len(prompts), len(cells), dtype=torch.long)
    for row, tokens in enumerate(out.tokens):
        counts[row % len(prompts), index[tuple(tokens[:3])]] += 1  # a continuation outside `cells` is a KeyError
    p_value, dof = grouped_chi_square(counts, expected)
    return p_value, detectable_tvd(DEFAULT_TARGET_ROWS, dof)


@pytest.mark.slow  # ~75 s; the same code in CI: the grid's reduced_vocab, small_lm_int8 and distilled_like rows
@pytest.mark.default_target
def test_the_shipped_distilled_draft_samples_the_default_target(default_pair):
    """draft=distilled as shipped (reduced vocabulary, int8 weights on a CPU) at K = 2, sampled."""
    p_value, tvd = check_shipped_distilled(default_pair)
    assert p_value > P_VALUE_THRESHOLD, (
        f"tokens 1..3 do not follow the target (p = {p_value:.2e}; this test detects a TVD >= {tvd:.3f} in a "
        f"prompt's joint with probability 0.9)")


@pytest.mark.slow
@pytest.mark.default_target
def test_a_broken_residual_is_caught_with_the_shipped_distilled_draft(default_pair, monkeypatch):
    monkeypatch.setattr(engine, "tree_verify", verify_with_broken_residual)
    p_value, _ = check_shipped_distilled(default_pair)
    assert p_value < P_VALUE_THRESHOLD, f"the broken residual passed (p = {p_value:.3f})"
