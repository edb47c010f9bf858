"""The round loop: propose K -> one target pass -> verify -> commit -> rewind.

A proposal is a tree of draft tokens; a chain is the tree whose token i hangs under token i - 1,
and goes through the same pass, rule and rewind. The autoregressive baseline is this same loop
with no draft (K = 0: each round is one target pass over the tip and a "bonus" token from p), so
both are timed by the same code.
"""

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from specexp.core.interface import Context, Drafter, HostView, Proposal, RoundSeen
from specexp.core.k_policy import KPolicy
from specexp.core.kv import RaggedKV, StaticRaggedKV, new_ragged_kv
from specexp.core.readbacks import read_back, round_started
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.core.tree import proposal_depth
from specexp.core.verify import greedy_verify, tree_verify


@dataclass
class GenerationOutput:
    """Tokens and per-round statistics of one batch. Stats are returned, never logged here.

    Rounds are those after the prompt pass, which also yields the first new token.
    """

    tokens: list[list[int]]  # generated ids per row (prompt excluded, EOS included if hit)
    n_proposed: torch.Tensor  # [R, B] draft tokens put to the target (a tree's nodes)
    n_accepted: torch.Tensor  # [R, B] of those, accepted by the rule
    n_emitted: torch.Tensor  # [R, B] tokens committed (accepted + resampled/bonus, cut at EOS/limit)
    active: torch.Tensor  # [R, B] bool: row still generating in that round
    depth: torch.Tensor | None = None  # [R, B] the proposal's depth (a chain's: n_proposed)
    paths: list[torch.Tensor] = field(default_factory=list)  # [R] of [B, D_r]: the accepted nodes, -1 after
    group: torch.Tensor | None = None  # [R, B] long: the proposal's group (prompt lookup: its match length; else 0)
    k_chosen: list[int] = field(default_factory=list)  # [R] K asked of the draft (0: no draft that round)
    # [R] committed tokens of the longest row (what the pass attends to)
    context: list[int] = field(default_factory=list)
    # [R] seconds of each round's phases (on a GPU from CUDA events, read once the decode has ended)
    draft_s: list[float] = field(default_factory=list)  # proposing (and choosing K)
    reencode_s: list[float] = field(default_factory=list)  # of draft_s: re-encoding text (Proposal.reencode_s)
    target_s: list[float] = field(default_factory=list)  # the target pass + warp
    verify_s: list[float] = field(default_factory=list)  # verifying, committing, the readback, rewinding
    prefill_s: float = 0.0  # prompt pass of the target (with the first new token) and draft reset
    total_s: float = 0.0  # wall clock of the whole call, to one synchronisation at its end


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> ids [B, P] and mask [B, P], padded on the left so every tip is at P-1."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[b, P - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _first_true(x: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim [B, N] -> [B] (N where none)."""
    N = x.shape[-1]
    idx = torch.arange(N, device=x.device).expand_as(x)
    return torch.where(x, idx, N).min(-1).values


def commit(lengths: torch.Tensor, done: torch.Tensor, new: torch.Tensor, n_accepted: torch.Tensor, eos: torch.Tensor,
           limit: torch.Tensor, generated: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """How many of x_1..x_n and the resampled/bonus token ([B, K+1] ``new``) each row commits: cut after
    an EOS and at ``limit`` new tokens (0-d), nothing for finished rows. Returns (n_emitted, lengths,
    done, generated) after the commit."""
    K = new.shape[1] - 1
    n_emit = n_accepted + 1
    offsets = torch.arange(K + 1, device=new.device)
    is_eos = torch.isin(new, eos) & (offsets < n_emit[:, None])  # [B, K+1]
    first_eos = _first_true(is_eos)  # [B]
    hit_eos = first_eos <= K
    n_emit = torch.where(hit_eos, first_eos + 1, n_emit)
    n_emit = torch.minimum(n_emit, limit - generated)
    active = ~done
    n_emit = torch.where(active, n_emit, 0)
    generated = generated + n_emit
    return n_emit, lengths + n_emit, done | (active & hit_eos) | (generated >= limit), generated


def write_committed(committed: torch.Tensor, lengths: torch.Tensor, new: torch.Tensor) -> None:
    """Write each row's ``new`` [B, D+1] after its committed tokens in ``committed`` [B, S]; slots past
    what `commit` counted stay scratch."""
    committed.scatter_(1, lengths[:, None] + torch.arange(new.shape[1], device=new.device), new)


def settle(tokens: torch.Tensor, parents: torch.Tensor | None, draft_probs: torch.Tensor, p: torch.Tensor,
           rule: Callable, lengths: torch.Tensor, done: torch.Tensor, generated: torch.Tensor, eos: torch.Tensor,
           limit: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Steps 3 and 4 of a round as one function of tensors: ``rule`` (`greedy_verify`, or `tree_verify`
    with the generator) gives the accepted path [B, D] through the proposal against ``p``, then the
    path's tokens and the next token are counted for the commit (`commit`). Returns (path, n_accepted,
    next_token, new [B, D+1], n_emitted, lengths, done, generated). runtime.compile=true runs greedy
    rounds' through a compiled copy (a sampled round's draws take a torch.Generator, which torch.compile
    cannot trace)."""
    path, n_accepted, next_token = rule(tokens, parents, draft_probs, p)
    new = torch.cat([tokens.gather(1, path.clamp_min(0)), next_token[:, None]], dim=1)  # [B, D+1]
    new.scatter_(1, n_accepted[:, None], next_token[:, None])
    return path, n_accepted, next_token, new, *commit(lengths, done, new, n_accepted, eos, limit, generated)


def keep_features(ctx: Context, features: torch.Tensor, path: torch.Tensor, active: torch.Tensor) -> None:
    """Before the commit: the pass's hidden states [B, K+1, F] of the tip and the accepted path
    [B, D] go to the tip's slot and the D after it (past the path: scratch, as for tokens)."""
    D, F = path.shape[1], features.shape[-1]
    tip = torch.zeros(path.shape[0], 1, dtype=torch.long, device=path.device)
    sources = torch.cat([tip, 1 + path.clamp_min(0)], dim=1)  # [B, D+1]
    slots = (ctx.lengths - 1)[:, None] + torch.arange(D + 1, device=path.device)  # [B, D+1]
    kept = features.gather(1, sources[..., None].expand(-1, -1, F))
    held = ctx.features.gather(1, slots[..., None].expand(-1, -1, F))
    ctx.features.scatter_(1, slots[..., None].expand(-1, -1, F), torch.where(active[:, None, None], kept, held))


@dataclass
class Decoding:
    """A batch in flight: what one round reads and moves on."""

    ctx: Context
    kv: RaggedKV | StaticRaggedKV  # the target's cache: every committed token but the tip
    tip: torch.Tensor  # [B] the last committed token, whose p the next pass gives
    generated: torch.Tensor  # [B] new tokens committed per row
    eos: torch.Tensor  # [E] ids that end a row
    limit: torch.Tensor  # () max_new_tokens, on the device
    prompt_width: int  # P: the left-padded prompts' slots; new tokens start there
    vocab_size: int  # V of p (and of every q)
    hidden_layers: tuple[int, ...]  # the target's hidden states a feature draft reads; () none
    rule: Callable  # the verify rule for this decode's sampling (greedy_verify, or tree_verify with its generator)
    settle: Callable  # `settle`, or (greedy, runtime.compile=true) its compiled copy
    rounds: list[RoundSeen] = field(default_factory=list)  # what the host read back of each round


ROUND_STATS = ("n_proposed", "depth", "n_accepted", "n_emitted", "active", "group")  # [B] per round, stacked to [R, B]


def prompt_pass(target: Callable, prompts: list[list[int]], sampling: SamplingConfig, max_new_tokens: int, k_max: int,
                eos_token_ids: list[int], hidden_layers: tuple[int, ...], generator: torch.Generator | None,
                pad_token_id: int, compiled_settle: Callable | None = None) -> Decoding:
    """One target pass over the left-padded prompts gives p for the first new token: a round
    without a draft. From then on the target cache holds every committed token but the tip."""
    device = target.device
    B = len(prompts)
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id, device)  # [B, P]
    P = prompt_ids.shape[1]
    # Committed tokens; K+1 slots of slack past max_new_tokens take each round's scratch writes.
    buf = torch.full((B, P + max_new_tokens + k_max + 1), pad_token_id, dtype=torch.long, device=device)
    buf[:, :P] = prompt_ids
    ctx = Context(tokens=buf, start=P - prompt_mask.sum(1),
                  lengths=torch.full((B,), P, dtype=torch.long, device=device),
                  done=torch.zeros(B, dtype=torch.bool, device=device))
    kv = new_ragged_kv(target, B, device, capacity=buf.shape[1])
    if hidden_layers:
        logits, features = kv.forward_features(target, prompt_ids, hidden_layers, prompt_mask)  # [B, 1, V], [B, P, F]
        ctx.features = features.new_zeros(B, buf.shape[1], features.shape[-1])
        ctx.features[:, :P] = features
    else:
        logits = kv.forward(target, prompt_ids, prompt_mask)
    vocab_size = target.config.get_text_config().vocab_size
    no_draft = Proposal.empty(B, vocab_size, device)
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    rule = greedy_verify if sampling.greedy else functools.partial(tree_verify, generator=generator)
    limit = torch.tensor(max_new_tokens, device=device)
    _, _, tip, new, _, lengths, ctx.done, generated = settle(
        no_draft.tokens, None, no_draft.probs, target_distribution(logits.to(device), sampling), rule, ctx.lengths,
        ctx.done, torch.zeros(B, dtype=torch.long, device=device), eos, limit)  # tip [B]
    write_committed(ctx.tokens, ctx.lengths, new)
    ctx.lengths = lengths
    decoding = Decoding(ctx, kv, tip, generated, eos, limit, P, vocab_size, hidden_layers, rule,
                        settle if compiled_settle is None or not sampling.greedy else compiled_settle)
    first = read_back(tip=tip, done=ctx.done)  # the batch's first readback: the host learns the first token
    tokens = np.full(tuple(buf.shape), pad_token_id, dtype=np.int64)
    for b, prompt in enumerate(prompts):
        tokens[b, P - len(prompt) : P] = prompt
    tokens[:, P] = first["tip"]
    ctx.host = HostView(tokens=tokens, start=np.array([P - len(p) for p in prompts], dtype=np.int64),
                        lengths=np.full(B, P + 1, dtype=np.int64), done=first["done"], n_accepted=np.zeros(B, np.int64))
    return decoding


def target_distribution(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """p from the target's logits [B, n, V]: the warped probabilities [B, n, V], or under greedy
    decoding, where p is one-hot, its hot ids [B, n] (no vocabulary-wide tensor)."""
    return logits.argmax(-1) if sampling.greedy else logits_to_probs(logits, sampling)


def target_pass(target: Callable, drafter: Drafter | None, state: Decoding, proposal: Proposal,
                drafted: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target over [tip, x_1..x_K] (a tree's nodes each see their ancestors): logits [B, K+1, V]
    and, for a feature draft, the hidden states it reads [B, K+1, F]."""
    inputs = torch.cat([state.tip[:, None], proposal.tokens], dim=1)  # [B, K+1]
    K = proposal.tokens.shape[1]
    # an early-exit draft already ran its layers for tip, x_1..x_{K-1}
    if drafted and drafter.traits.shares_target_pass:
        return drafter.target_forward(inputs), None
    if state.hidden_layers:
        return state.kv.forward_features(target, inputs, state.hidden_layers, logits_to_keep=K + 1,
                                         parents=proposal.parents)
    return state.kv.forward(target, inputs, logits_to_keep=K + 1, parents=proposal.parents), None


def read_round(state: Decoding, proposal: Proposal, n_accepted: torch.Tensor, n_emit: torch.Tensor,
               new: torch.Tensor, path: torch.Tensor, active: np.ndarray) -> RoundSeen:
    """The round's one readback (core/readbacks.py): what the host needs to go on, and its statistics.
    The host's copy of the committed tokens takes each row's new ones."""
    ctx, host, K = state.ctx, state.ctx.host, proposal.tokens.shape[1]
    depth = proposal_depth(proposal.tokens, proposal.probs, proposal.n_proposed, proposal.parents)  # [B]
    group = proposal.group if proposal.group is not None else torch.zeros_like(n_accepted)
    chain = proposal.parents is None or K == 0
    tree = {} if chain else {"path": path}  # a chain's path follows from n_accepted
    seen = read_back(n_proposed=proposal.n_proposed, depth=depth, n_accepted=n_accepted, n_emitted=n_emit,
                     done=ctx.done, group=group, new=new, **tree)
    if chain:
        order = np.arange(K)
        seen["path"] = np.where(order < seen["n_accepted"][:, None], order, -1)
    rows, offsets = np.nonzero(np.arange(seen["new"].shape[1]) < seen["n_emitted"][:, None])  # each committed token
    host.tokens[rows, host.lengths[rows] + offsets] = seen["new"][rows, offsets]
    host.lengths = host.lengths + seen["n_emitted"]
    host.done, host.n_accepted = seen["done"], seen["n_accepted"]
    return RoundSeen(n_proposed=seen["n_proposed"], depth=seen["depth"], n_accepted=seen["n_accepted"],
                     n_emitted=seen["n_emitted"], active=active, group=seen["group"], path=seen["path"], n_nodes=K)


def decode_round(target: Callable, drafter: Drafter | None, state: Decoding, k_round: int, sampling: SamplingConfig,
                 generator: torch.Generator | None, k_policy: KPolicy | None, mark: Callable[[], None]) -> Proposal:
    """One round for every row still generating; returns its verified proposal (``accepted_path`` filled in)
    and appends what the host read back of it to ``state.rounds``; ``mark`` marks the ends of drafting and of
    the target pass. The device is read back once (step 5), unless the draft or policy asks for more."""
    ctx, B, device = state.ctx, state.tip.shape[0], state.tip.device
    active = ~ctx.host.done
    # 1. Propose up to K tokens per row with their q (K = 0: the draft sits the round out).
    if k_round == 0:
        proposal = Proposal.empty(B, state.vocab_size, device)
    else:
        proposal = drafter.propose(ctx, k_round, sampling, generator)
        if k_policy is not None and not drafter.traits.shares_target_pass:  # a shared pass continues all it drafted
            proposal = k_policy.shorten(proposal, ctx)
    K = proposal.tokens.shape[1]
    mark()

    # 2. One target pass over [tip, x_1..x_K]: p at K+1 positions (greedy: p's hot ids).
    logits, features = target_pass(target, drafter, state, proposal, k_round > 0)
    p = target_distribution(logits.to(device), sampling)  # a device_map target's logits are on its last device
    mark()

    # 3. Verify: the accepted path [B, D] through the tree (a chain's: 0..n-1); 4. commit the path's tokens
    # x_1..x_n then next_token (and the tip's and path's hidden states).
    path, n_accepted, next_token, new, n_emit, lengths, done, state.generated = state.settle(
        proposal.tokens, proposal.parents, proposal.probs, p, state.rule, ctx.lengths, ctx.done, state.generated,
        state.eos, state.limit)
    proposal.accepted_path = path
    if state.hidden_layers:
        keep_features(ctx, features, path, ~ctx.done)
    write_committed(ctx.tokens, ctx.lengths, new)
    ctx.lengths, ctx.done = lengths, done

    # 5. The one readback: accepted and committed counts, done, the new tokens.
    seen = read_round(state, proposal, n_accepted, n_emit, new, path, active)
    state.rounds.append(seen)

    # 6. Rewind: the target keeps tip, x_1..x_n (moved into place from a tree); the draft rewinds itself.
    chain = proposal.parents is None or K == 0
    state.kv.keep_path(path, n_accepted, K, chain=chain, kept=int(seen.n_accepted.max(initial=0)))
    if k_round > 0:
        drafter.update(ctx, proposal, n_accepted)
    if k_policy is not None:
        k_policy.observe(seen)
    state.tip = next_token
    return proposal


def finish(out: GenerationOutput, state: Decoding) -> GenerationOutput:
    """Stack the per-round statistics [R, B] and cut each row's new tokens out of the host's copy (no readback)."""
    B, host = state.tip.shape[0], state.ctx.host
    for name in ROUND_STATS:
        values = [getattr(seen, name) for seen in state.rounds]
        empty = torch.zeros(0, B, dtype=torch.bool if name == "active" else torch.long)
        setattr(out, name, torch.from_numpy(np.stack(values)) if values else empty)
    out.paths = [torch.from_numpy(seen.path) for seen in state.rounds]
    out.tokens = [host.tokens[b, state.prompt_width : host.lengths[b]].tolist() for b in range(B)]
    return out


def device_sync(device: torch.device) -> Callable[[], None]:
    """What waits for the device before a clock is read: every GPU (a device_map target's pass ends
    on its last one); nothing on a CPU."""
    if device.type != "cuda":
        return lambda: None
    return lambda: [torch.cuda.synchronize(i) for i in range(torch.cuda.device_count())]


class PhaseClock:
    """Marks a decode's phases without stalling the device: on a GPU each mark records a CUDA event,
    all read once after the decode's last synchronisation; on a CPU each mark reads the clock."""

    def __init__(self, device: torch.device, clock: Callable[[], float]):
        self.events, self.clock = device.type == "cuda", clock
        self.marks: list = []

    def mark(self) -> None:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(self.clock())

    def seconds(self) -> list[float]:
        """Seconds from each mark to the next (on a GPU: the device must have passed the last mark)."""
        if self.events:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]


@torch.inference_mode()
def generate(
    target: Callable,  # a causal LM, or the lean runtime's decoder of one
    prompts: list[list[int]],
    drafter: Drafter | None,
    sampling: SamplingConfig,
    max_new_tokens: int,
    eos_token_ids: list[int],
    generator: torch.Generator | None = None,
    pad_token_id: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    k_policy: KPolicy | None = None,
    k_max: int | None = None,
    compiled_settle: Callable | None = None,
) -> GenerationOutput:
    """Decode a batch of prompts speculatively (or autoregressively when drafter is None).

    Each round asks the draft for ``k_max`` tokens (None: its ``traits.k_max``; 0: never ask it,
    the A/A control with the draft built); ``k_policy`` chooses each round's K up to that instead
    (0 runs the round without the draft) and may shorten the proposal. ``compiled_settle``: `settle`
    compiled (runtime.compile=true), which greedy rounds run through.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt must have at least one token")
    k_max = 0 if drafter is None else (drafter.traits.k_max if k_max is None else k_max)
    hidden_layers = drafter.traits.hidden_layers if drafter is not None else ()
    phases = PhaseClock(target.device, clock)

    start_time = clock()
    phases.mark()
    state = prompt_pass(target, prompts, sampling, max_new_tokens, k_max, eos_token_ids, hidden_layers, generator,
                        pad_token_id, compiled_settle)
    if drafter is not None and drafter.traits.shares_target_pass:
        drafter.attach(state.kv)
    if drafter is not None:
        drafter.reset(state.ctx)
    if k_policy is not None:
        k_policy.begin(len(prompts), k_max, max_new_tokens)
    phases.mark()
    out = GenerationOutput(tokens=[], n_proposed=None, n_accepted=None, n_emitted=None, active=None)

    host = state.ctx.host
    while not host.done.all():  # the host's copy: the last round's readback told it
        phases.mark()  # the round's start, drafted, target pass done (in decode_round), its end
        round_started()
        out.context.append(int(host.lengths.max()))
        k_round = k_max if k_policy is None else k_policy.choose(state.ctx)
        out.k_chosen.append(k_round)
        proposal = decode_round(target, drafter, state, k_round, sampling, generator, k_policy, phases.mark)
        phases.mark()
        out.reencode_s.append(proposal.reencode_s)

    device_sync(target.device)()
    out.total_s = clock() - start_time
    seconds = phases.seconds()
    out.prefill_s = seconds[0]
    out.draft_s, out.target_s, out.verify_s = (seconds[2 + i :: 4] for i in range(3))  # [1::4]: between rounds
    return finish(out, state)
