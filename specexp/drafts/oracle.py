"""A synthetic draft that validates the cost model: acceptance and cost set by hand.

`draft=oracle` knows the target's greedy continuation of every prompt (decoded once, untimed,
before the study) and proposes it with each token independently replaced by a wrong one with
probability 1 - alpha_i at draft position i. Under greedy decoding a right token is accepted and
a wrong one rejected, so position i is accepted with probability alpha_i given the ones before
it: the per-position acceptance is known in advance. Its cost is real: each round runs a
random-weight Llama of the chosen size (`cost_layers` x `cost_hidden`, the target's vocabulary)
through the runtime, exactly as a small_lm draft of that size would (its tokens are discarded).
Exact like every draft: the rule decides, the oracle only proposes.
"""

from collections.abc import Sequence

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specexp.core.interface import Context, DraftTraits, Proposal, StepCompiler
from specexp.core.sampling import SamplingConfig
from specexp.drafts.parts.base import check_k
from specexp.drafts.small_lm import SmallLMDrafter
from specexp.errors import UserInputError
from specexp.models import LoadedModel


def random_llama(target: LoadedModel, layers: int, hidden: int, seed: int = 0) -> LoadedModel:
    """A random-weight Llama on the target's vocabulary, device and dtype: a draft's cost without its skill."""
    torch.manual_seed(seed)
    heads = max(hidden // 64, 1)
    config = LlamaConfig(vocab_size=target.vocab_size, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=target.context_length or 8192, tie_word_embeddings=True)
    dtype = next(target.model.parameters()).dtype
    model = LlamaForCausalLM(config).to(device=target.model.device, dtype=dtype).eval()
    return LoadedModel(model=model, tokenizer=None, name=f"random-llama-{layers}x{hidden}")


class OracleDrafter:
    """``cost``: a model to run for the draft's cost (a small LM of the shape to study) instead of the random
    Llama of ``cost_layers`` x ``cost_hidden``."""

    def __init__(self, target: LoadedModel, alpha: float | Sequence[float] = 0.6, k: int = 4, cost_layers: int = 2,
                 cost_hidden: int = 256, seed: int = 0, cost: LoadedModel | None = None):
        check_k(k)
        alphas = [float(alpha)] if isinstance(alpha, int | float) else [float(a) for a in alpha]
        if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
            raise UserInputError(f"draft.alpha={alpha} is not allowed; give a probability in [0, 1] or a list of them "
                                 "(per draft position; the last one holds for later positions)")
        if cost_layers < 0 or cost_hidden < 1:
            raise UserInputError(f"draft.cost_layers={cost_layers}, draft.cost_hidden={cost_hidden} are not allowed; "
                                 "layers >= 0 (0: a free draft) and hidden >= 1")
        self.alphas, self.vocab_size = alphas, target.vocab_size
        self.cost_model = cost if cost is not None else random_llama(target, cost_layers, cost_hidden, seed) \
            if cost_layers else None
        self.cost = SmallLMDrafter(target, self.cost_model, k=k) if self.cost_model is not None else None
        # acceptance is only set by hand when the rule is greedy's; the study decodes the reference first
        self.traits = DraftTraits(k_max=k, models=self.cost.traits.models if self.cost else (), greedy_only=True,
                                  needs_reference=True)
        device = target.model.device
        self.generator = torch.Generator(device).manual_seed(seed)  # which tokens it spoils, drawn on the device
        self.reference: dict[tuple, list[int]] = {}
        self.rows: torch.Tensor | None = None  # [B, M]: each row's continuation, padded
        self.row_lengths: torch.Tensor | None = None  # [B]: its length
        self.first_new: torch.Tensor | None = None  # [B]: the slot of each row's first new token
        self.alpha_rows: dict[int, torch.Tensor] = {}  # K -> alpha per position [K], on the device

    def compile_steps(self, compiler: StepCompiler) -> None:
        if self.cost is not None:
            self.cost.compile_steps(compiler)

    def set_reference(self, prompts: list[list[int]], continuations: list[list[int]]) -> None:
        self.reference = {tuple(p): c for p, c in zip(prompts, continuations, strict=True)}

    def alpha_at(self, position: int) -> float:
        return self.alphas[min(position, len(self.alphas) - 1)]

    def reset(self, ctx: Context) -> None:
        host, device = ctx.on_host(), ctx.tokens.device
        rows = []
        for b in range(len(host.start)):
            prompt = tuple(host.committed(b)[:-1])  # the first new token is committed
            if prompt not in self.reference:
                raise UserInputError("draft=oracle was given no greedy continuation for a prompt; it runs inside a "
                                     "study (python -m specexp draft=oracle), which decodes them first")
            rows.append(self.reference[prompt])
        width = max(max(map(len, rows)), 1)
        padded = np.zeros((len(rows), width), dtype=np.int64)
        for b, row in enumerate(rows):
            padded[b, : len(row)] = row
        self.rows = torch.from_numpy(padded).to(device)
        self.row_lengths = torch.tensor([len(row) for row in rows], device=device)
        self.first_new = torch.from_numpy(host.lengths - 1).to(device)
        if self.cost is not None:
            self.cost.reset(ctx)

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        """Each row's next k reference tokens, position i kept with probability alpha_i and else shifted
        to another id: all on the device, no host work per token."""
        if not sampling.greedy:
            raise UserInputError("draft=oracle needs greedy decoding (sampling=greedy): its acceptance is set by hand "
                                 "only when the rule accepts exactly the target's argmax")
        if self.cost is not None:  # the draft's real work, its tokens discarded
            self.cost.propose(ctx, k, sampling, None)
        B, device = ctx.tokens.shape[0], ctx.tokens.device
        generated = ctx.lengths - self.first_new  # [B]
        at = generated[:, None] + torch.arange(k, device=device)  # [B, k]
        right = self.rows.gather(1, at.clamp_max(self.rows.shape[1] - 1))
        n_proposed = torch.where(ctx.done, 0, (self.row_lengths - generated).clamp(0, k))  # [B]
        alphas = self.alpha_rows.get(k)
        if alphas is None:  # made once per K: a copy to the device each round would be host work
            alphas = self.alpha_rows[k] = torch.tensor([self.alpha_at(i) for i in range(k)], device=device)
        kept = torch.rand(B, k, generator=self.generator, device=device) < alphas
        shift = torch.randint(1, self.vocab_size, (B, k), generator=self.generator, device=device)
        tokens = torch.where(kept, right, (right + shift) % self.vocab_size)  # [B, k]
        valid = torch.arange(k, device=device) < n_proposed[:, None]
        probs = torch.zeros(B, k, self.vocab_size, device=device).scatter_(2, tokens[..., None],
                                                                           valid[..., None].float())
        return Proposal(tokens=tokens, probs=probs, n_proposed=n_proposed)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        if self.cost is not None:
            self.cost.update(ctx, proposal, n_accepted)
