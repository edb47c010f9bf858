"""target.device_map: a target spread over devices by accelerate runs through transformers'
forward (its hooks move inputs between devices) and decodes exactly as the same model on one."""

import pytest
import torch
from hydra import compose, initialize_config_dir

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.errors import UserInputError
from specexp.models import load_model, spread_over_devices
from specexp.paths import CONFIG_DIR
from specexp.runtime.lean import LeanRuntime
from tests.conftest import tiny_model

NO_EOS = [10**6]


@pytest.fixture(scope="module")
def saved_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_model(0, layers=2).model.float().save_pretrained(folder)
    return folder


def decode(forward, prompts, drafter):
    return generate(forward, prompts, drafter, SamplingConfig(), 16, NO_EOS, torch.Generator().manual_seed(0)).tokens


# An explicit map over two devices this machine has: layer 1 lives on disk and is loaded by
# accelerate's hook on every pass, as a layer on a second GPU would be moved to.
SPREAD = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
          "model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.mark.parametrize("device_map", ["auto", "spread"])
def test_a_mapped_target_decodes_like_the_model_on_one_device(saved_target, prompts, tmp_path, monkeypatch, device_map):
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path))
    reference = load_model(str(saved_target), dtype="float32", device="cpu")
    mapped = load_model(str(saved_target), dtype="float32", device="cpu",
                        device_map=SPREAD if device_map == "spread" else device_map,
                        offload_folder=str(tmp_path / "off"))
    assert spread_over_devices(mapped.model) == (device_map == "spread")
    prepared = LeanRuntime().prepare(mapped, None, [1, 2, 3])
    if device_map == "spread":  # transformers' forward with accelerate's hooks, which the plan would bypass
        assert prepared.forward is mapped.model and "device_map" in prepared.record["fallback_reason"]
        assert not prepared.record["matmul_plan"]
    else:
        assert prepared.record["name"] == "lean"
    for drafter in (None, PromptLookupDrafter(mapped, k=2)):
        assert decode(prepared.forward, prompts, drafter) == decode(reference.model, prompts, None)


def test_device_map_values_are_checked(saved_target):
    with pytest.raises(UserInputError, match="target.device_map='everywhere' is not allowed; choose one of auto, "):
        load_model(str(saved_target), device_map="everywhere")


def test_the_hf_target_config_takes_a_device_map():
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["target=hf", "target.name_or_path=x", "target.device_map=auto",
                                                       "runtime=hf"])
    assert cfg.target.device_map == "auto" and cfg.runtime._target_ == "specexp.runtime.HFRuntime"
