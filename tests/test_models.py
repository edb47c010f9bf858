"""Model loading: local folders, clear errors, same-vocabulary drafts."""

import hashlib

import numpy as np
import pytest
import torch

from specexp.core.interface import Context
from specexp.core.sampling import SamplingConfig
from specexp.drafts.small_lm import SmallLMDrafter, align_vocab
from specexp.errors import UserInputError
from specexp.models import embedded, load_model, reuse
from tests.conftest import tiny_model


def test_local_folder_loads_with_dtype(tmp_path):
    tiny_model(0).model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), dtype="float32", device="cpu")
    assert loaded.model.dtype == torch.float32 and loaded.tokenizer is None and loaded.vocab_size == 64


def test_a_folder_loaded_again_shares_its_weights_but_not_what_a_job_did_to_its_modules(tmp_path):
    """A sweep's next job gets the kept weights under its own modules: the first job's fused
    projections and replaced head stay with it, and the output is the fresh load's."""
    from specexp.runtime.decoder import fuse_linears

    tiny_model(0).model.save_pretrained(tmp_path / "m")
    ids = torch.tensor([[5, 6, 7, 8]])
    first = load_model(str(tmp_path / "m"), dtype="float64", device="cpu").model
    expected = first(ids).logits
    attention = first.model.layers[0].self_attn
    attention.q_proj = fuse_linears([attention.q_proj, attention.k_proj])  # a job's runtime at work
    first.lm_head = torch.nn.Identity()
    second = load_model(str(tmp_path / "m"), dtype="float64", device="cpu").model
    assert torch.equal(second(ids).logits, expected)
    assert second.model.embed_tokens.weight.data_ptr() == first.model.embed_tokens.weight.data_ptr()  # not loaded again
    assert second.model.embed_tokens.weight is not first.model.embed_tokens.weight


def test_a_kept_loads_fused_projections_are_made_once_and_a_written_weight_is_fused_afresh(tmp_path):
    """The lean runtime's fused q/k/v of a kept load: the next load's decoder reads the first one's (no
    new memory per sweep job) and decodes as transformers' forward; a weight written in place since
    (nothing in specexp does) no longer matches the kept one, so its fusion is made anew."""
    from specexp.runtime.decoder import LeanDecoder

    tiny_model(0).model.save_pretrained(tmp_path / "m")
    ids = torch.tensor([[5, 6, 7, 8]])
    loads = [load_model(str(tmp_path / "m"), dtype="float64", device="cpu").model for _ in range(3)]
    expected = loads[0](ids).logits[:, -1]
    fused = [LeanDecoder(model).layers[0].qkv.weight for model in loads[:2]]
    assert fused[0].data_ptr() == fused[1].data_ptr()
    attention = loads[1].model.layers[0].self_attn
    assert attention.k_proj.weight.data_ptr() == fused[0][attention.q_proj.out_features:].data_ptr()  # views of it
    torch.testing.assert_close(LeanDecoder(loads[1])(ids, logits_to_keep=1).logits[:, -1], expected, rtol=0, atol=1e-12)
    with torch.no_grad():
        # the kept tensor itself: every load's weights change
        loads[2].model.layers[0].self_attn.q_proj.weight.mul_(2.0)
    written = LeanDecoder(loads[2]).layers[0].qkv.weight
    assert written.data_ptr() != fused[0].data_ptr()
    assert torch.equal(written[: attention.q_proj.out_features], loads[2].model.layers[0].self_attn.q_proj.weight)


def test_a_kept_loads_int8_draft_weights_are_made_once(tmp_path):
    """Two jobs' int8 drafts of one kept load hold the same int8 tensors (quantized once), each under
    its own modules, and decode as a draft quantized from a private copy does."""
    from specexp.drafts.parts.quantize import quantize_linears

    tiny_model(0).model.float().save_pretrained(tmp_path / "m")
    jobs = [quantize_linears(load_model(str(tmp_path / "m"), dtype="float32", device="cpu").model, "int8")
            for _ in range(2)]
    private = quantize_linears(tiny_model(0).model.float(), "int8")
    assert jobs[0].lm_head is not jobs[1].lm_head and jobs[0].lm_head.weight is jobs[1].lm_head.weight
    assert jobs[0].lm_head.weight.data_ptr() != private.lm_head.weight.data_ptr()
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(jobs[1](ids).logits, private(ids).logits)


def test_a_folder_saved_again_or_a_model_too_large_to_keep_is_loaded_afresh(tmp_path, monkeypatch):
    tiny_model(0).model.save_pretrained(tmp_path / "m")
    before = load_model(str(tmp_path / "m"), dtype="float64", device="cpu").model.lm_head.weight
    tiny_model(1).model.save_pretrained(tmp_path / "m")  # retrained into the same folder
    after = load_model(str(tmp_path / "m"), dtype="float64", device="cpu").model.lm_head.weight
    assert torch.equal(after, tiny_model(1).model.lm_head.weight) and not torch.equal(after, before)
    monkeypatch.setattr(reuse, "REUSED_MAX_BYTES", 0)
    tiny_model(2).model.save_pretrained(tmp_path / "big")
    loads = [load_model(str(tmp_path / "big"), dtype="float64", device="cpu").model for _ in range(2)]
    assert loads[0].lm_head.weight.data_ptr() != loads[1].lm_head.weight.data_ptr()


def test_a_gguf_conversion_parses_the_file_once(tmp_path, monkeypatch):
    """transformers' config and model loads each parse the GGUF (~3.6 s for SmolLM2's): inside
    gguf_parsed_once one parse serves both, and the gguf module is as it was after."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parses = []

    class CountedReader(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountedReader)
    with embedded.gguf_parsed_once():
        configs = [load_gguf_checkpoint(path)["config"] for _ in range(2)]
    assert len(parses) == 1 and configs[0] == configs[1] and configs[0]["num_hidden_layers"] == 1
    assert gguf.GGUFReader is CountedReader
    load_gguf_checkpoint(path)
    assert len(parses) == 2  # outside it, each load parses again


def test_missing_path_and_bad_dtype_are_clear(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        load_model(str(tmp_path / "nothing"))
    tiny_model(0).model.save_pretrained(tmp_path / "m")
    with pytest.raises(UserInputError, match="not a torch dtype"):
        load_model(str(tmp_path / "m"), dtype="float33")


def test_vocab_mismatch_is_an_error(target):
    with pytest.raises(UserInputError, match="vocab mismatch"):
        SmallLMDrafter(target, tiny_model(3, vocab_size=80), k=2)


def test_align_vocab_pads_and_truncates():
    logits = torch.randn(2, 5)
    assert torch.equal(align_vocab(logits, 3), logits[:, :3])
    padded = align_vocab(logits, 7)
    assert padded.shape == (2, 7) and torch.isinf(padded[:, 5:]).all()


@pytest.mark.parametrize("branches", [1, 2])
def test_small_lm_cache_catches_up_beside_a_finished_row_after_rounds_without_the_draft(target, other_draft, branches):
    """A finished row stops growing while the others pile up committed tokens in rounds that skip
    the draft (draft.k=auto): once a row's pending tokens outnumber all the finished row holds, the
    draft still feeds each live row exactly its uncached tokens, and its q is the draft model's
    distribution after that row's committed tokens, as from a fresh pass."""
    drafter = SmallLMDrafter(target, other_draft, k=2, branches=branches)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, target.vocab_size, (2, 40), generator=g)
    # row 0: the longer prompt (6 tokens, no padding), finished; row 1: 3 tokens, left-padded to slot 3
    ctx = Context(tokens=tokens, start=torch.tensor([0, 3]), lengths=torch.tensor([6, 6]),
                  done=torch.tensor([False, False]))
    drafter.reset(ctx)
    proposal = drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(temperature=1.0), g)
    proposal.accepted_path = torch.full_like(proposal.tokens, -1)  # what the engine sets: nothing accepted
    drafter.update(ctx, proposal, torch.zeros(2, dtype=torch.long))
    ctx.done[0], ctx.lengths[1] = True, 6 + 12  # 12 rounds without the draft: row 1's pending (13) > row 0's 6 tokens
    proposal = drafter.propose(ctx, drafter.traits.k_max, SamplingConfig(temperature=1.0), g)
    with torch.no_grad():
        fresh = other_draft.model(input_ids=tokens[1:, 3:18]).logits[0, -1].softmax(-1)  # [V]
    torch.testing.assert_close(proposal.probs[1, 0].double(), fresh.double(), rtol=1e-4, atol=1e-6)


@pytest.mark.default_target
def test_preparing_studies_leaves_the_kept_weights_as_loaded():
    """What a study does to its target's modules (fused projections, matmul plans, int8 drafts over
    the target's layers, an early exit sharing its pass) never writes into the weights the process
    keeps for its next job."""
    from hydra import compose, initialize_config_dir

    from specexp.models.embedded import EMBEDDED_NAME, load_embedded_target
    from specexp.paths import CONFIG_DIR
    from specexp.study.run import prepare

    load_embedded_target("float32", "cpu")
    kept = next(load.model for key, load in reuse._reused.items() if key[0].endswith(EMBEDDED_NAME))
    def digests() -> dict[str, str]:  # of the bytes in place: a clone would be 540 MB of fresh memory
        return {name: hashlib.blake2b(tensor.detach().contiguous().numpy(), digest_size=16).hexdigest()
                for name, tensor in kept.state_dict().items()}

    before = digests()
    for draft in (["draft=target_prefix", "draft.quantize=int8"], ["draft=early_exit"], ["draft=eagle"],
                  ["draft=distilled", "draft.quantize=int8"]):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose("config", overrides=[*draft, "size=smoke", "data.limit=1", "draft.k=2",
                                               "profile.enabled=false", "dtype=float32", "device=cpu"])
        prepare(cfg)
    assert digests() == before
    for layer in kept.model.layers:  # and the fused projections the jobs shared still hold the kept weights
        mlp = [layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]
        assert torch.equal(reuse.derived_from_kept("fused", mlp, lambda: None), torch.cat(mlp))
