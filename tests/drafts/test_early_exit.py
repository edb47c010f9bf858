"""Early-exit self-speculation: the split forward, the shared cache (target logits equal a full
forward after rewinds, early layers never recomputed), greedy identity over exit layers, K and
modes, trained heads (training raises alpha; save/load; exact as drafts), and bad input."""

import json

import lightning as L
import pytest
import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.distill.data import token_blocks
from specexp.distill.module import DistillModule
from specexp.drafts.early_exit import SharedEarlyExitDrafter, early_exit_drafter
from specexp.drafts.parts.exit_head import HEAD_CONFIG, ExitHead, exit_head_student
from specexp.errors import UserInputError
from specexp.runtime.decoder import lean_decoder
from tests.conftest import EOS, random_exit_head, tiny_model
from tests.distilling import fit_and_validate, target_documents

GREEDY = SamplingConfig()
NO_EOS = [10**6]


def deep_tiny_model(seed: int, scale: float = 6.0, **kwargs):
    """Four layers, so the exit can sit at 1, 2 or 3; each layer's residual updates scaled up so
    that an early exit disagrees with the last layer (a random tiny model barely changes its
    residual stream after the embedding)."""
    target = tiny_model(seed, layers=4, scale=scale, **kwargs)
    with torch.no_grad():
        for layer in target.model.model.layers:
            layer.mlp.down_proj.weight.mul_(4.0)
            layer.self_attn.o_proj.weight.mul_(4.0)
    return target


@pytest.fixture(scope="module")
def deep_target():
    return deep_tiny_model(3)


def _gen(target, prompts, drafter, sampling=GREEDY, max_new=20, seed=0):
    return generate(target.model, prompts, drafter, sampling, max_new, NO_EOS, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_split_forward_equals_the_models_forward(deep_target, exit_layer):
    model = deep_target.model
    ids = torch.tensor([[5, 9, 2, 7, 7, 30], [4, 4, 8, 1, 60, 3]])
    positions = torch.arange(6)[None].expand(2, 6)
    decoder = lean_decoder(model)
    hidden = decoder.run_layers(decoder.embed(ids), range(exit_layer), None, None, positions)
    hidden = decoder.run_layers(hidden, range(exit_layer, decoder.n_layers), None, None, positions)
    with torch.no_grad():
        torch.testing.assert_close(decoder.logits(hidden), model(ids).logits, rtol=0, atol=1e-10)


class RecordingSharedDrafter(SharedEarlyExitDrafter):
    """Checks every target pass against a full forward (no cache) over the row's committed
    tokens + this round's inputs, and counts token positions run through each decoder layer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_error, self.passes, self.ctx = 0.0, 0, None
        self.positions = [0] * self.decoder.n_layers
        # o_proj runs once per layer and pass, on [B, T, H]: a count of the positions each layer ran
        self.hooks = [w.layer.self_attn.o_proj.register_forward_hook(
                          lambda mod, args, out, i=i: self._count(i, args[0]))
                      for i, w in enumerate(self.decoder.layers)]

    def remove_hooks(self):
        for hook in self.hooks:
            hook.remove()

    def _count(self, i, hidden):
        if self.ctx is not None:
            self.positions[i] += hidden.shape[0] * hidden.shape[1]

    def propose(self, ctx, k, sampling, generator):
        self.ctx = ctx
        return super().propose(ctx, k, sampling, generator)

    def target_forward(self, inputs):
        logits = super().target_forward(inputs)
        ctx, n = self.ctx, inputs.shape[1]
        with torch.no_grad():
            for b in range(inputs.shape[0]):
                if ctx.done[b]:
                    continue
                committed = ctx.tokens[b, ctx.start[b] : ctx.lengths[b] - 1]  # the tip is inputs[b, 0]
                full = self.parts_model(torch.cat([committed, inputs[b]])[None]).logits[0, -n:]
                self.max_error = max(self.max_error, float((full - logits[b]).abs().max()))
        self.passes += 1
        return logits

    def update(self, ctx, proposal, n_accepted):
        super().update(ctx, proposal, n_accepted)
        self.ctx = None  # stop counting until the next propose
        self.rejections = getattr(self, "rejections", 0) + int(((n_accepted < proposal.n_proposed) & ~ctx.done).sum())


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0)], ids=["greedy", "t1"])
@pytest.mark.parametrize("exit_layer", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 3])
def test_shared_cache_target_pass_equals_a_full_forward_after_rewinds(deep_target, prompts, exit_layer, k, sampling):
    # A head with half the vocabulary: rejections (and so rewinds) in every configuration.
    drafter = RecordingSharedDrafter(deep_target, random_exit_head(deep_target, exit_layer), k=k)
    drafter.parts_model = deep_target.model
    out = _gen(deep_target, prompts, drafter, sampling)
    drafter.remove_hooks()
    assert drafter.passes > 3 and drafter.rejections > 0  # rewinds happened
    assert drafter.max_error < 1e-10
    if sampling.greedy:
        assert out.tokens == _gen(deep_target, prompts, None).tokens


@pytest.mark.parametrize("exit_layer", [1, 3])
def test_shared_mode_never_recomputes_the_early_layers(deep_target, prompts, exit_layer):
    """Per round, layers below the exit see K+1 positions (K drafting steps + x_K) and the layers
    above it K+1: a full target pass would add K+1 more to every early layer."""
    k = 3
    drafter = RecordingSharedDrafter(deep_target, ExitHead.untrained(lean_decoder(deep_target.model), exit_layer), k=k)
    drafter.parts_model = lambda ids: type("Out", (), {"logits": torch.zeros(1, ids.shape[1], 64)})  # no checking
    out = _gen(deep_target, prompts, drafter)
    drafter.remove_hooks()
    rows_rounds = out.active.shape[0] * len(prompts)
    assert drafter.positions == [rows_rounds * (k + 1)] * 4


@pytest.mark.parametrize("mode", ["shared", "naive"])
@pytest.mark.parametrize("exit_layer", [2, 3])
@pytest.mark.parametrize("k", [2, 5])
def test_greedy_identity_and_same_drafts_in_both_modes(deep_target, prompts, mode, exit_layer, k):
    alone = _gen(deep_target, prompts, None)
    spec = _gen(deep_target, prompts, early_exit_drafter(deep_target, exit_layer=exit_layer, k=k, mode=mode))
    assert spec.tokens == alone.tokens
    other = _gen(deep_target, prompts, early_exit_drafter(deep_target, exit_layer=exit_layer, k=k,
                                                            mode="naive" if mode == "shared" else "shared"))
    # Both modes draft from the same layers over the same committed tokens: the same acceptances.
    assert spec.n_accepted[spec.active].tolist() == other.n_accepted[other.active].tolist()


def test_a_shared_drafts_standalone_copy_drafts_what_it_drafts(deep_target, prompts):
    """SharesTargetPass.standalone: what the pairing replay runs for a shared early exit (no target pass to
    share there) accepts what the shared draft accepts, round for round, and is not itself shared."""
    shared = early_exit_drafter(deep_target, exit_layer=2, k=3, mode="shared")
    standalone = shared.standalone()
    assert not standalone.traits.shares_target_pass and standalone.traits.k_max == 3
    spec, copy = _gen(deep_target, prompts, shared), _gen(deep_target, prompts, standalone)
    assert spec.tokens == copy.tokens
    assert spec.n_accepted[spec.active].tolist() == copy.n_accepted[copy.active].tolist()


def test_trained_head_raises_heldout_alpha_then_loads_as_an_exact_draft(tmp_path):
    target = deep_tiny_model(0, scale=3.0)
    target.model.float()
    blocks = token_blocks(target_documents(target), EOS, 32)
    L.seed_everything(0)
    student = exit_head_student(target, exit_layer=1, adapter_size=32)
    params_before = {k: v.clone() for k, v in target.model.state_dict().items()}
    module = DistillModule(student, target, "forward_kl", lr=1e-2, warmup_steps=2)
    # The adapter starts at zero: "before" is the untrained head (the target's own norm + LM head).
    before, after = fit_and_validate(tmp_path, module, blocks, steps=80)
    assert after["val/alpha"] > before["val/alpha"] + 0.025  # measured 0.839 -> 0.883
    assert all(torch.equal(v, target.model.state_dict()[k]) for k, v in params_before.items())  # trunk frozen

    student.model.save_pretrained(tmp_path / "head")
    assert json.loads((tmp_path / "head" / HEAD_CONFIG).read_text())["exit_layer"] == 1
    assert sorted(student.model.state_dict()) == sorted(f"head.{k}" for k in student.model.head.state_dict())
    prompts = [[5, 6, 7], [9, 3, 4, 4, 2]]
    alone = _gen(target, prompts, None)
    for mode in ("shared", "naive"):
        spec = _gen(target, prompts, early_exit_drafter(target, k=3, head=str(tmp_path / "head"), mode=mode))
        assert spec.tokens == alone.tokens


def test_reduced_vocabulary_head_round_trips(deep_target, prompts, tmp_path):
    head = random_exit_head(deep_target, 2)
    head.save(tmp_path / "head")
    loaded = ExitHead.load(tmp_path / "head", deep_target)
    assert loaded.draft_vocab.target_ids.tolist() == head.draft_vocab.target_ids.tolist()
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in head.state_dict().items())
    sampling = SamplingConfig(temperature=1.0)
    a, b = (_gen(deep_target, prompts, SharedEarlyExitDrafter(deep_target, h, k=3), sampling, seed=2)
            for h in (head, loaded))
    assert a.tokens == b.tokens and torch.equal(a.n_accepted, b.n_accepted)


def test_sampling_with_a_trained_head_repeats_per_seed(deep_target, prompts):
    sampling = SamplingConfig(temperature=1.0)
    runs = [_gen(deep_target, prompts, SharedEarlyExitDrafter(deep_target, random_exit_head(deep_target, 2), k=3),
                 sampling, seed=s) for s in (1, 1, 2)]
    assert runs[0].tokens == runs[1].tokens and runs[0].tokens != runs[2].tokens


def test_bad_inputs(deep_target, tmp_path):
    with pytest.raises(UserInputError, match=r"exit_layer=4 is not allowed; it must be in 1..3"):
        early_exit_drafter(deep_target, exit_layer=4)
    with pytest.raises(UserInputError, match=r"exit_layer=0 is not allowed"):
        early_exit_drafter(deep_target, exit_layer=0, mode="naive")
    with pytest.raises(UserInputError, match="draft.mode='fast' is not allowed; choose one of shared, naive"):
        early_exit_drafter(deep_target, exit_layer=1, mode="fast")
    with pytest.raises(UserInputError, match="draft.k=0 is not allowed"):
        early_exit_drafter(deep_target, exit_layer=1, k=0)
    with pytest.raises(UserInputError, match="exit head '/no/such/head' does not exist"):
        early_exit_drafter(deep_target, head="/no/such/head")
    with pytest.raises(UserInputError, match="no trained exit head ships for exit_layer=3"):
        early_exit_drafter(deep_target, exit_layer=3, head="trained")
    random_exit_head(deep_target, 2).save(tmp_path / "head")
    with pytest.raises(UserInputError, match="draft.exit_layer=1 but the head .* was trained at layer 2"):
        early_exit_drafter(deep_target, exit_layer=1, head=str(tmp_path / "head"))
    wider = deep_tiny_model(4, hidden=48)
    with pytest.raises(UserInputError, match="was trained for another target"):
        early_exit_drafter(wider, head=str(tmp_path / "head"))
    with pytest.raises(UserInputError, match="on_policy.ratio=0.5 needs a student that generates"):
        DistillModule(exit_head_student(deep_target, 1, 8), deep_target, on_policy_ratio=0.5)
