"""A small causal LM sharing the target's vocabulary, with its own ragged KV cache; one of another
tokenizer drafts through drafts/cross_vocab.py (`small_lm_draft` picks)."""

import dataclasses
from pathlib import Path

import numpy as np
import torch

from specexp.core.interface import Context, DraftTraits, Proposal, StepCompiler
from specexp.core.kv import RaggedKV, StaticRaggedKV, new_ragged_kv
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.draft_vocab import DraftVocab, sample_draft, vocab_fingerprint
from specexp.drafts.cross_vocab import CrossVocabDrafter
from specexp.drafts.parts.base import check_k, check_min_confidence
from specexp.drafts.parts.dynamic_tree import TreeRegion, check_tree, grow_tree
from specexp.drafts.parts.quantize import quantize_linears
from specexp.errors import DraftDoesNotApply, UserInputError
from specexp.models import LoadedModel, first_layers, load_model
from specexp.models.embedded import load_embedded_gemma3, load_embedded_target
from specexp.runtime.decoder import lean_decoder, unsupported_reason


def tokenizers_differ(draft: LoadedModel, target: LoadedModel) -> bool:
    """Both have tokenizers, and they index different tokens: a pair for the cross-vocabulary drafter."""
    return (draft.tokenizer is not None and target.tokenizer is not None and draft.draft_vocab is None
            and draft.tokenizer.get_vocab() != target.tokenizer.get_vocab())


def check_same_vocabulary(draft: LoadedModel, target: LoadedModel) -> None:
    """Speculative decoding compares p and q token by token: both must index the same tokens."""
    if draft.tokenizer is not None and target.tokenizer is not None:
        same = draft.tokenizer.get_vocab() == target.tokenizer.get_vocab()
        sizes = f"{len(draft.tokenizer)} vs {len(target.tokenizer)} tokens"
    else:
        same = draft.vocab_size == target.vocab_size
        sizes = f"{draft.vocab_size} vs {target.vocab_size} logits"
    if not same and draft.draft_vocab is not None:  # its ids are a subset of another tokenizer's: no mapping
        raise DraftDoesNotApply(f"vocab mismatch: draft '{draft.name}' has a reduced vocabulary of another tokenizer "
                                f"than target '{target.name}''s ({sizes}); train one for this target")
    if not same:
        raise UserInputError(
            f"vocab mismatch: draft '{draft.name}' and target '{target.name}' have different vocabularies "
            f"({sizes}); a draft of another vocabulary needs both tokenizers (a model folder with its tokenizer)"
        )
    if draft.draft_vocab is not None and draft.draft_vocab.fingerprint not in (None, vocab_fingerprint(target)):
        raise DraftDoesNotApply(
            f"vocab mismatch: the reduced vocabulary of draft '{draft.name}' was built for "
            f"{draft.draft_vocab.fingerprint}; the target '{target.name}' has {vocab_fingerprint(target)}"
        )


def top_probability(logits: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] -> the untempered probability of the most likely token [B]: the draft's
    confidence, the same under greedy and sampled decoding."""
    return logits.float().softmax(-1).max(-1).values


def align_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits [..., V_d] -> [..., vocab_size]: drop padded rows past the target's, or pad with -inf."""
    V_d = logits.shape[-1]
    if V_d >= vocab_size:
        return logits[..., :vocab_size]
    return torch.nn.functional.pad(logits, (0, vocab_size - V_d), value=float("-inf"))


class SmallLMDrafter:
    """Drafts K tokens autoregressively from a small LM, sampling with the shared warp.

    A reduced-vocabulary draft (a `draft_vocab.json` beside the model) reads target ids mapped
    into its vocabulary and hands q in the target's space, zero outside its tokens.

    A row stops drafting before the first token the draft itself gives less than
    ``min_confidence`` (its untempered top probability over the tokens it can propose; HF's
    ``assistant_confidence_threshold``, except that the doubtful token is not proposed): the
    draft length adapts before verification, so exactness is untouched, and a round whose first
    token is doubtful costs one target token instead of two.

    ``quantize="int8"`` runs the draft with int8 weights (CPU; `drafts/parts/quantize.py`): a cheaper
    draft step, still exact.

    ``branches`` > 1 drafts an EAGLE-2-style dynamic tree of K nodes (`drafts/parts/dynamic_tree.py`) of
    at most ``depth`` levels: each level is one draft step over the expanded nodes, which see their
    ancestors through a tree mask on the draft's own cache; after verification the accepted path's
    entries are moved into place and the rest dropped.

    Cache invariant between rounds: the draft cache holds a prefix of each row's committed
    tokens (none before its first proposal of a batch); the rest is fed at the start of the next
    propose.
    """

    def __init__(self, target: LoadedModel, model: str | LoadedModel, k: int = 4, dtype: str = "auto",
                 device: str | None = None, min_confidence: float = 0.0, quantize: str | None = None,
                 branches: int = 1, depth: int | None = None):
        check_k(k)
        check_min_confidence(min_confidence)
        check_tree(branches, depth, min_confidence)
        self.min_confidence, self.branches, self.depth = min_confidence, branches, depth
        if isinstance(model, str):
            model = load_model(model, dtype=dtype, device=device or str(target.model.device))
        check_same_vocabulary(model, target)
        self.draft = dataclasses.replace(model, model=quantize_linears(model.model, quantize))
        # The draft's step is its whole cost c: a Llama-shaped draft runs through the lean decoder
        # (no per-call plumbing, fused projections, a static cache), anything else through its own forward.
        self.lean = unsupported_reason(self.draft.model) is None
        self.forward_model = lean_decoder(self.draft.model) if self.lean else self.draft.model
        self.traits = DraftTraits(k_max=k, models=(self.draft.model,), branches=branches, grows_trees=branches > 1,
                                  markov_chain=branches == 1)
        self.vocab_size = target.vocab_size
        self.draft_vocab: DraftVocab | None = model.draft_vocab
        self.kv: RaggedKV | StaticRaggedKV | None = None
        self.filled = False  # the cache holds the batch's committed tokens (filled at its first proposal)
        self.cached: np.ndarray | None = None  # [B]: tokens the cache holds per row, as the host knows (None: ask it)
        self.n_fed = 0  # drafted tokens the last propose put into the cache (update rewinds them)
        self.fed_end = 0  # the cache's slots after the last propose fed the committed tokens
        self.node_slots: torch.Tensor | None = None  # [B, N]: a tree node's slot after the tip in the cache, or -1

    def compile_steps(self, compiler: StepCompiler) -> None:
        if self.lean:  # another architecture keeps transformers' forward
            self.forward_model = compiler.decoder(self.forward_model, "draft")

    def reset(self, ctx: Context) -> None:
        # The cache is made and filled at the first proposal, so that a batch whose rounds never ask the draft
        # (draft.k=auto where no K pays, draft.k=0) neither pays the draft's prompt pass nor holds its cache
        # while the target decodes (docs/lab_notes/code_measurements.md: lazy draft cache).
        self.kv = None
        self.filled = False

    def _fill(self, ctx: Context) -> None:
        """One pass over every row's committed tokens but its tip. Rows are left-padded to a common
        start; a finished row shorter than the longest is padded on the right (it drafts no more)."""
        host = ctx.on_host()
        self.kv = new_ragged_kv(self.forward_model, ctx.tokens.shape[0], ctx.tokens.device,
                                capacity=ctx.tokens.shape[1])
        L = int(host.lengths.max()) - 1
        if L > 0:
            slots = torch.arange(L, device=ctx.tokens.device)[None, :]  # [1, L]
            mask = (slots >= ctx.start[:, None]) & (slots < ctx.lengths[:, None] - 1)  # [B, L]
            self.kv.forward(self.forward_model, self._draft_ids(ctx.tokens[:, :L]), mask.long())
        self.cached = host.lengths - 1 - host.start
        self.filled = True

    def _draft_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens if self.draft_vocab is None else self.draft_vocab.to_draft(tokens)

    def _step(self, input_ids: torch.Tensor, sampling: SamplingConfig, generator,
              input_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Target ids [B, T] in (``input_mask`` 0: left padding) -> the next token [B] (target id),
        its q [B, V] and whether the draft is confident enough to propose it [B]."""
        logits = self.kv.forward(self.forward_model, self._draft_ids(input_ids), input_mask,
                                 logits_to_keep=1)[:, -1]  # [B, V_d]
        if self.draft_vocab is None:
            logits = align_vocab(logits, self.vocab_size)  # [B, V]
        x, q = sample_draft(logits, self.draft_vocab, sampling, generator)
        if self.min_confidence == 0.0:
            return x, q, torch.ones_like(x, dtype=torch.bool)
        proposable = logits if self.draft_vocab is None else logits[:, : self.draft_vocab.size]  # [B, V or N]
        return x, q, top_probability(proposable) >= self.min_confidence

    def _feed_pending(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's last T committed slots, T the most uncached tokens of any row (the host knows
        how many each row holds): a row with fewer pending has its older slots masked out, and slots
        before a row's start are padding. Returns them [B, T] and the mask."""
        if not self.filled:
            self._fill(ctx)
        if self.cached is None:  # after a tree round the host does not know how many nodes each row kept
            self.cached = self.kv.n_valid.cpu().numpy()
        host, device = ctx.on_host(), ctx.tokens.device
        committed = host.lengths - host.start  # [B]
        T = int((committed - self.cached).max())
        slots = ctx.lengths[:, None] - T + torch.arange(T, device=device)  # [B, T]
        pending = (ctx.lengths - ctx.start) - self.kv.n_valid  # [B], on the device as the host has it
        self.cached = committed
        return ctx.tokens.gather(1, slots.clamp_min(0)), (torch.arange(T, device=device) >= T - pending[:, None]).long()

    @torch.inference_mode()
    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        feed, feed_mask = self._feed_pending(ctx)
        if self.branches > 1:
            return self._propose_tree(ctx, k, feed, feed_mask, sampling, generator)
        tokens, probs = [], []
        drafting = torch.ones_like(ctx.done)  # [B]: rows that have not stopped
        n_proposed = torch.zeros_like(ctx.lengths)
        self.n_fed = 0
        x, q, confident = self._step(feed, sampling, generator, feed_mask)
        self.fed_end = self.kv.mask.shape[1]
        for i in range(k):
            drafting = drafting & confident
            if self.min_confidence > 0.0 and not bool(drafting.any()):  # a readback per step only when rows can stop
                break
            tokens.append(x)
            probs.append(q if self.min_confidence == 0.0 else q * drafting[:, None])  # zero q = not proposed
            n_proposed = n_proposed + drafting.long()
            if i + 1 < k:
                x, q, confident = self._step(x[:, None], sampling, generator)
                self.n_fed += 1
        if not tokens:
            return Proposal.empty(ctx.tokens.shape[0], self.vocab_size, ctx.tokens.device)
        return Proposal(tokens=torch.stack(tokens, 1), probs=torch.stack(probs, 1),
                        n_proposed=n_proposed)  # [B, K'], K' <= K

    @torch.inference_mode()
    def q_along(self, prompts: list[list[int]], references: list[list[int]],
                sampling: SamplingConfig) -> list[torch.Tensor]:
        """The draft's q of every token of each reference on the reference's own prefix [A_b, V] (row 0,
        the prompt pass's token, and a row the draft is not confident enough to propose: 0), what its
        one-token proposals along the reference give (study/replay.draft_along), from one teacher-forced
        pass over prompt + reference per row instead of one draft step per token."""
        device = self.draft.model.device
        generator = torch.Generator(device).manual_seed(0)  # sample_draft draws a token too; only q is kept
        along = []
        for prompt, reference in zip(prompts, references, strict=True):
            if len(reference) < 2:  # only the prompt pass's token: nothing drafted along it
                along.append(torch.zeros(len(reference), self.vocab_size, device=device))
                continue
            ids = torch.tensor([prompt + reference[:-1]], device=device)  # [1, P + A - 1]: every prefix's last token
            kv = new_ragged_kv(self.forward_model, 1, device, capacity=ids.shape[1])
            # the head only where a prefix of R ends: [A - 1, V_d]
            logits = kv.forward(self.forward_model, self._draft_ids(ids), torch.ones_like(ids), len(reference) - 1)[0]
            if self.draft_vocab is None:
                logits = align_vocab(logits, self.vocab_size)
            _, q = sample_draft(logits, self.draft_vocab, sampling, generator)  # [A-1, V]
            if self.min_confidence > 0.0:
                proposable = logits if self.draft_vocab is None else logits[:, : self.draft_vocab.size]
                q = q * (top_probability(proposable) >= self.min_confidence)[:, None]
            along.append(torch.cat([q.new_zeros(1, q.shape[-1]), q]))  # [A, V]: q of R_t on prompt + R_<t, t >= 1
        return along

    def _target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V_d] -> [..., V] in the target's ids, -inf for tokens it cannot propose."""
        return (align_vocab(logits, self.vocab_size) if self.draft_vocab is None
                else self.draft_vocab.to_target_logits(logits))

    def _propose_tree(self, ctx: Context, k: int, feed: torch.Tensor, feed_mask: torch.Tensor,
                      sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        B, device = feed.shape[0], feed.device
        root = self._target_logits(self.kv.forward(self.forward_model, self._draft_ids(feed),
                                                   feed_mask)[:, -1])  # [B, V]
        tip_position = self.kv.n_valid[:, None] - 1  # [B, 1]: the tip is the last token fed
        region = TreeRegion(B, k, device)

        def expand(nodes, tokens, parents, depth):  # nodes, tokens, parents [B, e]
            seen = region.add(nodes, parents)
            positions = (tip_position + depth).expand(-1, nodes.shape[1])
            logits = self.kv.forward_nodes(self.forward_model, self._draft_ids(tokens), positions, seen,
                                           logits_to_keep=nodes.shape[1])
            logits = self._target_logits(logits)  # [B, e, V]
            return logits.float().softmax(-1), logits_to_probs(logits, sampling)

        tree = grow_tree(root.float().softmax(-1), logits_to_probs(root, sampling), expand, self.branches, k,
                         self.depth, sampling, generator)
        self.cached = None  # how many expanded nodes each row keeps, only the device knows
        self.node_slots, self.n_fed = region.slots[:, : tree.tokens.shape[1]], region.n_fed
        n_proposed = torch.full((B,), tree.tokens.shape[1], dtype=torch.long, device=device)
        return Proposal(tokens=tree.tokens, probs=tree.probs, n_proposed=n_proposed, parents=tree.parents)

    @torch.inference_mode()  # the cache is made (an inference tensor) at the first proposal
    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        if proposal.parents is not None:  # a tree: the accepted path's expanded nodes move after the tip
            path = proposal.accepted_path  # [B, D]
            slots = torch.where(path >= 0, self.node_slots.gather(1, path.clamp_min(0)), -1)  # [B, D]
            self.kv.keep_path(slots, (slots >= 0).sum(1), self.n_fed)  # expanded nodes are a prefix of the path
            return
        # The cache took x_1..x_fed; keep the accepted ones, the rest of the round is fed next time.
        kept = np.minimum(ctx.accepted_on_host(n_accepted), self.n_fed)  # [B]
        self.kv.drop_last(self.n_fed - n_accepted.clamp(max=self.n_fed), length=self.fed_end + int(kept.max()))
        self.cached = self.cached + kept


def small_lm_draft(target: LoadedModel, model: str | LoadedModel, k: int = 4, dtype: str = "auto",
                   device: str | None = None, min_confidence: float = 0.0, quantize: str | None = None,
                   branches: int = 1, depth: int | None = None, vocab_mapping: str = "string",
                   min_overlap: float = 0.05) -> "SmallLMDrafter | CrossVocabDrafter":
    """draft=small_lm: the draft LM as it is where it shares the target's tokenizer, else through the
    cross-vocabulary drafter (``vocab_mapping``: tli or string; ``min_overlap``: the least share of
    its tokens the target must spell the same)."""
    if isinstance(model, str):
        model = load_model(model, dtype=dtype, device=device or str(target.model.device))
    if not tokenizers_differ(model, target):
        return SmallLMDrafter(target, model, k=k, min_confidence=min_confidence, quantize=quantize, branches=branches,
                              depth=depth)
    if branches > 1 or min_confidence > 0.0:
        raise UserInputError(f"draft '{model.name}' has another tokenizer than target '{target.name}': it drafts "
                             f"chains (draft.branches=1) without min_confidence; got branches={branches}, "
                             f"min_confidence={min_confidence}")
    return CrossVocabDrafter(target, model, k=k, vocab_mapping=vocab_mapping, min_overlap=min_overlap,
                             quantize=quantize)


EMBEDDED_DRAFTS = {"smollm2_135m": load_embedded_target, "gemma3_270m": load_embedded_gemma3}  # config -> loader


def embedded_draft(target: LoadedModel, embedded: str, k: int = 4, dtype: str = "float32", quantize: str | None = None,
                   vocab_mapping: str = "string", min_overlap: float = 0.05) -> "SmallLMDrafter | CrossVocabDrafter":
    """draft=smollm2_135m / gemma3_270m: a model that ships in a package (SmolLM2-135M-Instruct, Gemma-3-270M)
    as the draft of any other target; of another family it drafts through the cross-vocabulary drafter."""
    draft = EMBEDDED_DRAFTS[embedded](dtype=dtype, device=str(target.model.device))
    if draft.name == target.name:
        raise DraftDoesNotApply(f"draft={embedded} is the target '{target.name}' itself; pair it with another target")
    return small_lm_draft(target, draft, k=k, quantize=quantize, vocab_mapping=vocab_mapping, min_overlap=min_overlap)


def target_prefix_drafter(target: LoadedModel, n_layers: int = 4, k: int = 4, min_confidence: float = 0.0,
                          quantize: str | None = None, branches: int = 1, depth: int | None = None) -> SmallLMDrafter:
    """A small_lm draft that needs no download: a copy of the target's first n layers + its head."""
    return SmallLMDrafter(target, first_layers(target, n_layers), k=k, min_confidence=min_confidence, quantize=quantize,
                          branches=branches, depth=depth)


DISTILLED_DRAFT = Path(__file__).resolve().parent.parent / "assets" / "distilled-smollm2-135m"


def distilled_drafter(target: LoadedModel, k: int = 1, dtype: str = "float32", device: str | None = None,
                      min_confidence: float = 0.0, quantize: str | None = "auto", branches: int = 1,
                      depth: int | None = None) -> SmallLMDrafter:
    """The draft distilled for the embedded default target that ships with specexp
    (`python -m specexp.distill experiment=distill_smollm2_tasks` reproduces it)."""
    if not (DISTILLED_DRAFT / "config.json").is_file():
        raise UserInputError(f"the shipped distilled draft is missing from {DISTILLED_DRAFT}; reinstall specexp")
    return SmallLMDrafter(target, str(DISTILLED_DRAFT), k=k, dtype=dtype, device=device, min_confidence=min_confidence,
                          quantize=quantize, branches=branches, depth=depth)
