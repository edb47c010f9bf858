"""Helpers shared by the benchmark scripts: one decode through our engine, one through HF."""

import platform
import time

import torch

from specexp.core.engine import GenerationOutput, generate
from specexp.core.sampling import SamplingConfig
from specexp.models import LoadedModel

GREEDY = SamplingConfig()


def decode_ours(target: LoadedModel, ids: list[int], drafter, max_new: int) -> GenerationOutput:
    return generate(target.model, [ids], drafter, GREEDY, max_new, target.eos_token_ids,
                    torch.Generator().manual_seed(0), target.pad_token_id)


@torch.inference_mode()
def decode_hf(target: LoadedModel, ids: list[int], max_new: int, **kwargs) -> tuple[list[int], float]:
    """HF generate(), greedy; returns the new tokens (EOS kept, like our engine) and seconds."""
    x = torch.tensor([ids])
    start = time.perf_counter()
    out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                                pad_token_id=target.pad_token_id, **kwargs)
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def machine() -> str:
    return (f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
            f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}")
