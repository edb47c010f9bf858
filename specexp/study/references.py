"""The target's own continuations of a study's prompts, decoded once per process: what the oracle
draft proposes from (greedy) and what the pairing replay judges drafts along (greedy or sampled)."""

from dataclasses import asdict

import torch

from specexp.core.engine import generate
from specexp.core.sampling import SamplingConfig
from specexp.models import LoadedModel

# (target, prompt, new tokens, warp, seed; greedy: no seed) -> continuation, shared by a sweep's jobs
_CONTINUATIONS: dict[tuple, list[int]] = {}


def continuations(forward, target: LoadedModel, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                  sampling: SamplingConfig | None = None, seed: int = 0) -> list[list[int]]:
    """The target's continuation of each prompt through ``forward``: greedy in batches of ``batch_size``,
    or sampled with ``sampling``'s warp one prompt at a time (prompt i seeded seed + i, so a prompt's
    continuation does not depend on the batch it came in)."""
    sampling = sampling or SamplingConfig()
    warp = () if sampling.greedy else tuple(sorted(asdict(sampling).items()))

    def key(i: int, prompt: list[int]) -> tuple:
        return target.name, tuple(prompt), max_new_tokens, warp, None if sampling.greedy else seed + i

    missing = [(i, p) for i, p in enumerate(prompts) if key(i, p) not in _CONTINUATIONS]
    step = batch_size if sampling.greedy else 1
    for start in range(0, len(missing), step):
        batch = missing[start : start + step]
        generator = None if sampling.greedy else torch.Generator(target.model.device).manual_seed(seed + batch[0][0])
        out = generate(forward, [p for _, p in batch], None, sampling, max_new_tokens, target.eos_token_ids, generator,
                       target.pad_token_id)
        for (i, prompt), tokens in zip(batch, out.tokens, strict=True):
            _CONTINUATIONS[key(i, prompt)] = tokens
    return [_CONTINUATIONS[key(i, p)] for i, p in enumerate(prompts)]


def greedy_continuations(forward, target: LoadedModel, prompts: list[list[int]], max_new_tokens: int,
                         batch_size: int) -> list[list[int]]:
    """The target's greedy continuation of each prompt (NeedsReference drafts are shown these)."""
    return continuations(forward, target, prompts, max_new_tokens, batch_size)
