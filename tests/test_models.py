"""Model loading: local folders, clear errors, same-vocabulary drafts."""

import pytest
import torch

from specexp.drafts.small_lm import SmallLMDrafter, align_vocab
from specexp.errors import UserInputError
from specexp.models import load_model
from tests.conftest import tiny_model


def test_local_folder_loads_with_dtype(tmp_path):
    tiny_model(0).model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), dtype="float32", device="cpu")
    assert loaded.model.dtype == torch.float32 and loaded.tokenizer is None and loaded.vocab_size == 64


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
