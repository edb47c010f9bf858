"""The engine's contract with every draft strategy: the committed context it shows a draft, the
proposal a draft hands back, what a draft declares of itself (DraftTraits), and the protocols a
draft implements. Everything above core/ reads a draft through this contract, never by probing
its attributes. core/ imports nothing above it."""

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from specexp.core.kv import RaggedKV, StaticRaggedKV
from specexp.core.sampling import SamplingConfig


@dataclass
class HostView:
    """A batch in flight as the host knows it, without reading the device: numpy copies the engine
    keeps from the prompts and from each round's one readback (core/readbacks.py). Drafts that
    work on the host (prompt lookup, n-grams, the oracle) and the K policies read these."""

    tokens: np.ndarray  # [B, S] int64: row b's committed ids in tokens[b, start[b]:lengths[b]]; past them stale
    start: np.ndarray  # [B] int64
    lengths: np.ndarray  # [B] int64
    done: np.ndarray  # [B] bool
    n_accepted: np.ndarray  # [B] int64: draft tokens the last round accepted (0 before the first round)

    @classmethod
    def read(cls, ctx: "Context") -> "HostView":
        """The view of a context the engine does not keep (one made by hand): read from its tensors."""
        return cls(tokens=ctx.tokens.cpu().numpy(), start=ctx.start.cpu().numpy(), lengths=ctx.lengths.cpu().numpy(),
                   done=ctx.done.cpu().numpy(), n_accepted=np.zeros(ctx.tokens.shape[0], dtype=np.int64))

    def committed(self, b: int, skip: int = 0) -> list[int]:
        """Row b's committed ids after its first ``skip``."""
        return self.tokens[b, self.start[b] + skip : self.lengths[b]].tolist()


@dataclass
class Context:
    """The committed tokens of a batch, as the engine keeps them.

    Row b holds ``tokens[b, start[b]:lengths[b]]``: its left-padded prompt, then everything
    committed so far. Slots past ``lengths[b]`` are scratch.
    """

    tokens: torch.Tensor  # [B, S] long
    start: torch.Tensor  # [B] long: first non-padding slot
    lengths: torch.Tensor  # [B] long: end (exclusive) of the committed tokens
    done: torch.Tensor  # [B] bool: row finished (EOS or max_new_tokens)
    # [B, S, F] or None: the target's hidden states at a feature draft's `hidden_layers` (side by
    # side) for every committed slot but the tip (whose pass comes next round); None for other drafts
    features: torch.Tensor | None = None
    host: HostView | None = None  # the engine's host copy; None for a context made by hand

    def on_host(self) -> HostView:
        """What the host knows of the batch: the engine's copy (no readback), else read from the tensors."""
        return self.host if self.host is not None else HostView.read(self)

    def accepted_on_host(self, n_accepted: torch.Tensor) -> np.ndarray:
        """The round's accepted counts [B] on the host: the engine's readback, else read from ``n_accepted``."""
        return self.host.n_accepted if self.host is not None else n_accepted.cpu().numpy()


@dataclass
class RoundSeen:
    """One round as the host read it back ([B] numpy each): what K policies learn from and the run logs."""

    n_proposed: np.ndarray  # draft tokens put to the target (a tree's nodes)
    depth: np.ndarray  # the proposal's depth (a chain's: n_proposed)
    n_accepted: np.ndarray  # of those, accepted by the rule
    n_emitted: np.ndarray  # tokens committed (accepted + resampled/bonus, cut at EOS/limit)
    active: np.ndarray  # bool: the row was still generating in the round
    group: np.ndarray  # the proposal's group (prompt lookup: its match length; else 0)
    path: np.ndarray  # [B, D]: the accepted nodes in order, -1 after (a chain's: 0..n_accepted-1)
    n_nodes: int  # K of the round: the proposal's width (0: no draft)


@dataclass
class Proposal:
    """What a draft hands the verifier for one round: a chain of K tokens, or a tree of K nodes.

    A row may propose fewer than K tokens: past its own count its tokens are arbitrary and
    its q rows are all zero, which the verifier treats as "rejected, resample from p". A tree
    node's q is the distribution it was drawn from given its earlier siblings (core/verify.py).
    """

    tokens: torch.Tensor  # [B, K] long
    probs: torch.Tensor  # [B, K, V]: q, one-hot for deterministic drafts
    n_proposed: torch.Tensor  # [B] long in 0..K
    # [B] long or None: what the draft knew of each row's proposal, grouping rounds whose tokens are
    # accepted alike (prompt lookup: the length of the n-gram match); `draft.k=auto` learns per group
    group: torch.Tensor | None = None
    # [B, K] long or None (a chain): the tokens form a tree, token i under token parents[i] (-1: the
    # committed tip; else an earlier index); a chain is the tree whose token i hangs under i - 1
    parents: torch.Tensor | None = None
    # [B, D] long, filled in by the engine after verification: the accepted nodes in order (-1 past them)
    accepted_path: torch.Tensor | None = None
    # seconds of this proposal spent re-encoding text between tokenizers (a cross-vocabulary draft;
    # 0 for the rest): a part of the round's draft time, reported apart as the pair's tokenizer tax
    reencode_s: float = 0.0
    # [B] numpy or None: n_proposed and group as a draft that works on the host built them, so a K
    # policy shortens the proposal without reading the device
    n_proposed_host: np.ndarray | None = None
    group_host: np.ndarray | None = None

    @classmethod
    def empty(cls, batch_size: int, vocab_size: int, device: torch.device) -> "Proposal":
        return cls(
            tokens=torch.zeros(batch_size, 0, dtype=torch.long, device=device),
            probs=torch.zeros(batch_size, 0, vocab_size, device=device),
            n_proposed=torch.zeros(batch_size, dtype=torch.long, device=device),
        )


@dataclass(frozen=True)
class DraftTraits:
    """What the engine, the study, the profile and the runtime need to know of a draft, declared
    once by the draft when it is built (``Drafter.traits``)."""

    k_max: int  # most tokens (a tree's nodes) one proposal holds, as built; 0: it never proposes (draft=none)
    # the models the draft runs: the runtime plans their products, the profile hashes their weights
    models: tuple[nn.Module, ...] = ()
    branches: int = 1  # > 1: each proposal is a token tree of K nodes, up to `branches` children a node
    grows_trees: bool = False  # its trees grow by confidence (drafts/parts/dynamic_tree.py): draft.tree=auto sizes them
    k_limit: int | None = None  # most tokens it can propose at all, whatever k_max (Medusa's chain: its heads)
    proposal_groups: int = 0  # its proposals carry Proposal.group in 0..n-1 (prompt lookup: match length); 0: none
    greedy_only: bool = False  # exact only under greedy decoding (the oracle sets its acceptance by hand)
    # transformers' output_hidden_states numbering of the target's hidden states it reads
    # (ReadsTargetFeatures: the engine keeps them in Context.features); () reads none
    hidden_layers: tuple[int, ...] = ()
    shares_target_pass: bool = False  # it runs the round's target pass itself (SharesTargetPass)
    needs_reference: bool = False  # it is shown the target's own greedy continuations first (NeedsReference)
    # its chain draws each token from its own next-token q given the tokens before it (an autoregressive
    # LM), so its q on any prefix is its one-token proposal there: the sampled replay judges every depth
    # with q on the target's prefix (study/replay.py), which it gives in one pass (MarkovChain.q_along)
    markov_chain: bool = False
    # a draft of another tokenizer: the share of its text tokens the target spells with the same bytes
    # (drafts/parts/vocab_map.py); None: it drafts in the target's own ids
    vocab_overlap: float | None = None


class Drafter(Protocol):
    """A draft strategy. The engine calls, per batch: reset, then per round propose -> update
    (a round the K policy gives K = 0 asks nothing of the draft: it catches up at its next propose)."""

    traits: DraftTraits

    def reset(self, ctx: Context) -> None:
        """Start a new batch of prompts (drop all per-sequence state)."""

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        """Propose up to ``k`` tokens per row (a tree: k nodes), with the distribution q each was
        drawn from. A study asks 1 <= k <= traits.k_max; a hardware profile times every k up to
        its own bound (and traits.k_limit)."""

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        """Learn what was accepted ([B] long) and rewind own state to the committed tip.

        ``ctx`` already holds the tokens committed this round; a draft that needs ``n_accepted`` on
        the host reads ``ctx.accepted_on_host(n_accepted)`` (the engine's copy: no readback).
        """


class StepCompiler(Protocol):
    """What runtime.compile=true hands a draft that runs models of its own (runtime/compiled.StepCompiler)."""

    def decoder(self, decoder, role: str):
        """A lean decoder's steps compiled (the same object for the same decoder): callable like it, with its
        ``run_layers``, ``embed`` and ``logits``; ``role`` names it in summary.json (target, draft)."""

    def function(self, fn, role: str):
        """A small function of the draft's compiled alike (heads over the target's features)."""


class RunsModels(Drafter, Protocol):
    """A draft that runs models of its own, declared by a non-empty ``traits.models``: under
    runtime.compile=true their steps run compiled (and on a GPU as CUDA graphs), as the target's do."""

    def compile_steps(self, compiler: StepCompiler) -> None:
        """Run every model step through ``compiler``'s compiled forwards from now on."""


class ReadsTargetFeatures(Drafter, Protocol):
    """A draft that reads the target's hidden states (EAGLE, Medusa), declared by a non-empty
    ``traits.hidden_layers``: the engine takes them from its own passes (the prompt's and every
    round's, at no extra target cost) and keeps the committed slots' in ``Context.features``,
    rewound with the cache."""


class SharesTargetPass(Drafter, Protocol):
    """A draft made of the target's own first layers (early exit, shared mode), declared by
    ``traits.shares_target_pass``.

    It writes those layers' KV for the positions it drafts from into the target's cache, so it
    runs the round's target pass itself and computes only what drafting left out.
    """

    def attach(self, kv: RaggedKV | StaticRaggedKV) -> None:
        """Take the target's cache (after the prompt pass, before reset)."""

    def target_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Append [tip, x_1..x_K] ([B, K+1]) to the target's cache; return its logits [B, K+1, V]."""

    def standalone(self) -> Drafter:
        """The same draft with a cache of its own, proposing the same tokens: what a replay along the
        target's continuation runs (study/replay.py), where no target pass runs for it to share."""


class MarkovChain(Drafter, Protocol):
    """An autoregressive draft, declared by ``traits.markov_chain``: its q on any prefix is what it
    would propose there, so it can score a whole continuation in one teacher-forced pass."""

    def q_along(self, prompts: list[list[int]], references: list[list[int]],
                sampling: SamplingConfig) -> list[torch.Tensor]:
        """Its q [A_b, V] of each token of reference b on prompt b + the reference's own prefix (row 0: 0)."""


class NeedsReference(Drafter, Protocol):
    """A draft shown the target's greedy continuations of the prompts before decoding (the
    oracle), declared by ``traits.needs_reference``; the study decodes them untimed."""

    def set_reference(self, prompts: list[list[int]], continuations: list[list[int]]) -> None:
        """The target's own greedy continuation of each prompt (token ids, prompt excluded)."""
