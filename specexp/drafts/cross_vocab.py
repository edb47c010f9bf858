"""A small LM of another tokenizer drafting for the target: pairs that share no vocabulary.

Each round the draft reads the committed text in its own tokenization: the target's committed ids
are decoded to text and re-encoded by the draft's tokenizer; its cache keeps the longest prefix
that still tokenizes the same and is fed the rest. Its proposal reaches the target's ids in one of
two ways (``vocab_mapping``):

- ``tli`` (Token-Level Intersection, Timor et al. 2025): the draft samples only among its tokens
  that the target spells with the same bytes (drafts/parts/vocab_map.py), q renormalised there; each
  drafted token is one target token, and q in the target's ids is that distribution (zero off the
  intersection). The usual rule is exact with it, and a sampled token keeps its q.
- ``string`` (Universal Assisted Generation): the drafted tokens become text, the target's
  tokenizer re-encodes it after the committed tail, and the target verifies those ids as a
  one-hot proposal. Exact for any proposal: accepting x with probability p(x) and otherwise
  resampling from p without x gives p.

Either way the target's distribution is untouched; the mapping only moves acceptance.
"""

import dataclasses
import time

import torch

from specexp.core.engine import left_pad
from specexp.core.interface import Context, DraftTraits, Proposal, StepCompiler
from specexp.core.kv import RaggedKV, StaticRaggedKV, new_ragged_kv
from specexp.core.sampling import SamplingConfig, logits_to_probs, sample
from specexp.drafts.parts.base import check_k, committed_tokens, common_prefix, one_hot_proposal
from specexp.drafts.parts.quantize import quantize_linears
from specexp.drafts.parts.vocab_map import check_overlap, vocab_map
from specexp.errors import UserInputError
from specexp.models import LoadedModel
from specexp.runtime.decoder import lean_decoder, unsupported_reason

MAPPINGS = ("tli", "string")
# committed target tokens re-encoded with a string proposal, so its first token joins them as the target would
TAIL_TOKENS = 4


class CrossVocabDrafter:
    """Drafts K tokens a round from a small LM whose tokenizer differs from the target's (a chain)."""

    def __init__(self, target: LoadedModel, draft: LoadedModel, k: int = 4, vocab_mapping: str = "tli",
                 min_overlap: float = 0.05, quantize: str | None = None):
        check_k(k)
        if vocab_mapping not in MAPPINGS:
            raise UserInputError(f"draft.vocab_mapping={vocab_mapping} is not allowed; "
                                 f"choose one of: {', '.join(MAPPINGS)}")
        for name, model in (("target", target), ("draft", draft)):
            if model.tokenizer is None:
                raise UserInputError(f"vocab mismatch: {name} '{model.name}' has no tokenizer, so its vocabulary "
                                     f"cannot be mapped to the other's; give a model folder with its tokenizer")
        self.draft = dataclasses.replace(draft, model=quantize_linears(draft.model, quantize))
        self.lean = unsupported_reason(self.draft.model) is None
        self.forward_model = lean_decoder(self.draft.model) if self.lean else self.draft.model
        self.target_tokenizer, self.draft_tokenizer = target.tokenizer, draft.tokenizer
        self.mapping = vocab_mapping
        self.vocab_size = target.vocab_size
        draft_logits = self.draft.model.config.get_text_config().vocab_size
        self.vocab_map = vocab_map(draft.tokenizer, target.tokenizer, draft_logits)
        check_overlap(self.vocab_map, min_overlap, draft.name, target.name)
        device = target.model.device
        to_target = self.vocab_map.to_target.clone()
        self.draft_eos = draft.eos_token_ids
        if target.eos_token_ids:  # an end of text ends both: the draft's EOS proposes the target's
            to_target[[i for i in self.draft_eos if i < draft_logits]] = target.eos_token_ids[0]
        self.target_eos = target.eos_token_ids[0] if target.eos_token_ids else None
        self.to_target = to_target.to(device)  # [V_d]
        self.shared_ids = (to_target >= 0).nonzero().flatten().to(device)  # [N] draft ids it may propose (tli)
        self.shared_targets = to_target[to_target >= 0].to(device)  # [N] their target ids
        self.empty_text_id = next(i for i in (draft.tokenizer.bos_token_id, draft.tokenizer.eos_token_id, 0)
                                  if i is not None)
        self.traits = DraftTraits(k_max=k, models=(self.draft.model,), vocab_overlap=self.vocab_map.overlap)
        self.kv: RaggedKV | StaticRaggedKV | None = None
        self.cached: list[list[int]] = []  # per row: the draft ids its cache holds

    def compile_steps(self, compiler: StepCompiler) -> None:
        if self.lean:  # another architecture keeps transformers' forward
            self.forward_model = compiler.decoder(self.forward_model, "draft")

    def reset(self, ctx: Context) -> None:
        self.kv = None
        self.cached = [[] for _ in range(ctx.tokens.shape[0])]

    def _draft_encoding(self, committed: list[list[int]]) -> list[list[int]]:
        """Each row's committed text in the draft's tokens (its BOS where its tokenizer adds one)."""
        texts = self.target_tokenizer.batch_decode(committed, skip_special_tokens=True,
                                                   clean_up_tokenization_spaces=False)
        encoded = self.draft_tokenizer(texts, add_special_tokens=True)["input_ids"]
        return [ids or [self.empty_text_id] for ids in encoded]

    def _feed(self, encoded: list[list[int]], device: torch.device) -> torch.Tensor:
        """Rewind each row's cache to the longest prefix of its new encoding it holds (one token short of it,
        whose logits come next), feed the rest; returns the next-token logits [B, V_d]."""
        keep = [min(common_prefix(held, ids), len(ids) - 1) for held, ids in zip(self.cached, encoded, strict=True)]
        if self.kv is None:
            capacity = 2 * max(len(ids) for ids in encoded) + 2 * self.traits.k_max
            self.kv = new_ragged_kv(self.forward_model, len(encoded), device, capacity=capacity)
        else:
            dropped = [len(held) - n for held, n in zip(self.cached, keep, strict=True)]
            self.kv.drop_last(torch.tensor(dropped, device=device))
        ids, mask = left_pad([row[n:] for row, n in zip(encoded, keep, strict=True)], 0, device)  # [B, T] each
        self.cached = [list(row) for row in encoded]
        return self.kv.forward(self.forward_model, ids, mask, logits_to_keep=1)[:, -1]

    @torch.inference_mode()
    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        started = time.perf_counter()
        committed = committed_tokens(ctx, [0] * ctx.tokens.shape[0])  # every row's, prompt included
        encoded = self._draft_encoding(committed)
        reencode_s = time.perf_counter() - started
        logits = self._feed(encoded, ctx.tokens.device)  # [B, V_d]
        drafted, probs = [], []
        for i in range(k):
            if self.mapping == "tli":  # q on the shared tokens only, renormalised by the warp
                shared = logits.gather(1, self.shared_ids.expand(logits.shape[0], -1))  # [B, N]
                q_shared = logits_to_probs(shared, sampling)  # [B, N]
                pick = sample(q_shared, generator)  # [B] index into the shared tokens
                drafted.append(self.shared_ids[pick])
                q = torch.zeros(logits.shape[0], self.vocab_size, dtype=q_shared.dtype, device=logits.device)
                probs.append(q.scatter_add_(1, self.shared_targets.expand(logits.shape[0], -1), q_shared))  # [B, V]
            else:
                drafted.append(sample(logits_to_probs(logits, sampling), generator))
            if i + 1 < k:
                logits = self.kv.forward(self.forward_model, drafted[-1][:, None], logits_to_keep=1)[:, -1]
                for row, token in zip(self.cached, drafted[-1].tolist(), strict=True):
                    row.append(token)
        drafted = torch.stack(drafted, 1)  # [B, K] draft ids
        if self.mapping == "tli":
            proposal = Proposal(tokens=self.to_target[drafted], probs=torch.stack(probs, 1),
                                n_proposed=torch.full_like(ctx.lengths, k))
        else:
            started = time.perf_counter()
            proposal = self._string_proposal(committed, drafted.tolist(), k, ctx.tokens.device)
            reencode_s += time.perf_counter() - started
        proposal.reencode_s = reencode_s  # decoding and re-encoding text, both mappings
        return proposal

    def _string_proposal(self, committed: list[list[int]], drafted: list[list[int]], k: int,
                         device: torch.device) -> Proposal:
        """The drafted text re-encoded by the target's tokenizer after each row's last committed tokens
        (the first new token merges with them as the target would tokenize), up to K, one-hot."""
        texts = []
        for row in drafted:
            stop = next((i for i, token in enumerate(row) if token in self.draft_eos), len(row))
            texts.append(self.draft_tokenizer.decode(row[:stop], skip_special_tokens=True).rstrip("\ufffd"))
        tails = [ids[-TAIL_TOKENS:] for ids in committed]
        tail_texts = self.target_tokenizer.batch_decode(tails, skip_special_tokens=False,
                                                        clean_up_tokenization_spaces=False)
        joined = [t + s for t, s in zip(tail_texts, texts, strict=True)]
        joined = self.target_tokenizer(joined, add_special_tokens=False)["input_ids"]
        alone = self.target_tokenizer(texts, add_special_tokens=False)["input_ids"]
        rows = []
        for row, tail, together, own in zip(drafted, tails, joined, alone, strict=True):
            ids = together[len(tail):] if together[: len(tail)] == tail else own
            if any(token in self.draft_eos for token in row) and self.target_eos is not None:
                ids = [*ids, self.target_eos]  # the draft ended its text
            # an added token past the target's logits ends the proposal
            beyond = next((i for i, token in enumerate(ids) if token >= self.vocab_size), len(ids))
            rows.append(ids[: min(k, beyond)])
        return one_hot_proposal(rows, self.vocab_size, device)

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        """Nothing to rewind now: the next proposal re-encodes the committed text and keeps the cache's
        longest matching prefix (the accepted drafted tokens, where the text still tokenizes so)."""
