"""`draft=eagle`: an EAGLE head (`drafts/parts/eagle_head.py`) drafts chains or EAGLE-2 dynamic trees
from the target's hidden states, which the engine hands it from its own passes
(`Context.features`: the prompt's and every verify pass's, rewound with the target's cache).

The head's cache holds one entry per committed token pair (the target's features at slot s,
the token at s+1), all computed from the target's true features; a round first feeds the pairs
committed since the last one, whose last output gives the first draft token, then feeds its own
outputs back (a chain: one entry per step; a tree: a level of expanded nodes per step, each
seeing its ancestors). After verification every drafted entry is dropped: the accepted tokens
come back next round as pairs with the target's true features, as in EAGLE.
"""

from pathlib import Path

import numpy as np
import torch

from specexp.core.interface import Context, DraftTraits, Proposal, StepCompiler
from specexp.core.kv import StaticRaggedKV, new_ragged_kv, region_mask
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.draft_vocab import sample_draft
from specexp.drafts.parts.base import check_k
from specexp.drafts.parts.dynamic_tree import TreeRegion, check_tree, grow_tree
from specexp.drafts.parts.eagle3_format import is_eagle3_folder
from specexp.drafts.parts.eagle3_head import Eagle3Head
from specexp.drafts.parts.eagle_head import EagleHead
from specexp.drafts.parts.quantize import quantize_linears
from specexp.errors import UserInputError
from specexp.models import LoadedModel

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SHIPPED = {"eagle3": ASSETS / "eagle3-smollm2-135m"}  # draft.head=NAME: trained for the default target


class EagleDrafter:
    """Chains (``branches`` = 1) or dynamic trees of ``k`` nodes from an EAGLE head."""

    def __init__(self, target: LoadedModel, head: EagleHead | Eagle3Head, k: int = 4, branches: int = 1,
                 depth: int | None = None):
        check_k(k)
        check_tree(branches, depth)
        self.branches, self.depth = branches, depth
        self.head = head
        self.traits = DraftTraits(k_max=k, models=(head,), branches=branches, grows_trees=branches > 1,
                                  hidden_layers=tuple(head.hidden_layers))
        self.forward = head.decoder()
        self.head_logits = head.logits  # h [..., H] -> logits [..., C]
        self.kv: StaticRaggedKV | None = None
        self.filled = False
        self.cached: np.ndarray | None = None  # [B]: committed pairs the cache holds per row, as the host knows
        self.fed_end = 0  # the cache's slots after the last propose fed the committed pairs
        self.n_drafted = 0  # entries the last propose drafted (update drops them)

    def compile_steps(self, compiler: StepCompiler) -> None:
        self.forward = compiler.decoder(self.forward, "draft")
        self.head_logits = compiler.function(self.head.logits, "draft")

    def reset(self, ctx: Context) -> None:
        self.kv = None  # made at the batch's first proposal (as the small-LM draft's): a batch never asked holds none
        self.filled = False

    def _run(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The head's layer over inputs x [B, T, H] whose slots the cache just booked -> h [B, T, H]."""
        return self.forward.run_layers(x, range(1), self.kv, self.kv.mask, positions, mask=mask)

    def _distribution(self, h: torch.Tensor, sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """h [..., H] -> (untempered draft probabilities, warped q), each [..., V] in the target's ids."""
        logits = self.head.target_logits(self.head_logits(h)).float()
        return logits.softmax(-1), logits_to_probs(logits, sampling)

    def _feed_committed(self, ctx: Context) -> torch.Tensor:
        """Append every committed pair the cache lacks; returns each row's last output h [B, H] (its
        next token's features). How many each row lacks the host knows: no readback."""
        host = ctx.on_host()
        B, device = ctx.tokens.shape[0], ctx.tokens.device
        pairs = host.lengths - 1 - host.start  # [B]: (features at s, token at s+1) for s in start..lengths-2
        if not self.filled:  # the first proposal of a batch: every row's pairs, left-padded to one start
            self.kv = new_ragged_kv(self.forward, B, device, capacity=ctx.tokens.shape[1])
            self.filled = True
            first = int(host.start.min())
            T = int(host.lengths.max()) - 1 - first
            slots = first + torch.arange(T, device=device)[None].expand(B, -1)  # [B, T]
            mask = (slots >= ctx.start[:, None]) & (slots < ctx.lengths[:, None] - 1)
            last = (ctx.lengths - 2 - first).clamp(0, max(T - 1, 0))  # [B]: each row's last pair
        else:
            # Every row feeds the T slots before its tip; a row with fewer pending pairs has its older ones masked.
            T = int((pairs - self.cached).max())
            slots = ctx.lengths[:, None] - 1 - T + torch.arange(T, device=device)  # [B, T]
            pending = (ctx.lengths - 1 - ctx.start) - self.kv.n_valid  # [B], on the device as the host has it
            mask, last = torch.arange(T, device=device) >= T - pending[:, None], torch.full_like(ctx.lengths, T - 1)
        self.cached = pairs
        if T == 0:  # one-token prompts: no features yet; any draft is exact, this one is the zero state's
            self.fed_end = self.kv.mask.shape[1]
            return torch.zeros(B, self.head.config.hidden_size, dtype=self.head.dtype, device=device)
        slots = slots.clamp_min(0)
        features = ctx.features.gather(1, slots[..., None].expand(-1, -1, ctx.features.shape[-1]))  # [B, T, F]
        x = self.head.inputs(ctx.tokens.gather(1, slots + 1), features)
        h = self._run(x, self.kv.extend(mask.long()))  # [B, T, H]
        self.fed_end = self.kv.mask.shape[1]
        return h.gather(1, last[:, None, None].expand(-1, 1, h.shape[-1]))[:, 0]

    def _step(self, tokens: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """One drafted entry per row: (the head's own h [B, H], the token after it [B]) -> h [B, H]."""
        x = self.head.inputs(tokens[:, None], g[:, None], fused=True)
        return self._run(x, self.kv.extend(torch.ones_like(tokens[:, None])))[:, 0]

    @torch.inference_mode()
    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator: torch.Generator | None) -> Proposal:
        h = self._feed_committed(ctx)
        if self.branches > 1:
            return self._propose_tree(h, k, sampling, generator)
        tokens, probs = [], []
        for i in range(k):
            x, q = sample_draft(self.head_logits(h), self.head.draft_vocab, sampling, generator)  # [B], [B, V]
            tokens.append(x)
            probs.append(q)
            if i + 1 < k:
                h = self._step(x, h)
        self.n_drafted = k - 1
        n_proposed = torch.full_like(ctx.lengths, k)
        return Proposal(tokens=torch.stack(tokens, 1), probs=torch.stack(probs, 1), n_proposed=n_proposed)

    def _propose_tree(self, root_h: torch.Tensor, k: int, sampling: SamplingConfig,
                      generator: torch.Generator | None) -> Proposal:
        B, device = root_h.shape[0], root_h.device
        last_position = self.kv.n_valid[:, None] - 1  # [B, 1]: the last committed pair's
        region = TreeRegion(B, k, device)
        node_h = root_h.new_zeros(B, k, root_h.shape[-1])  # [B, N, H]: an expanded node's output

        def expand(nodes, tokens, parents, depth):  # nodes, tokens, parents [B, e]
            e = nodes.shape[1]
            g = torch.where((parents >= 0)[..., None], node_h.gather(1, parents.clamp_min(0)[..., None].expand(
                -1, -1, node_h.shape[-1])), root_h[:, None])  # [B, e, H]: the parent's output
            seen = region.add(nodes, parents)
            self.kv.extend(torch.ones_like(tokens))
            h = self._run(self.head.inputs(tokens, g, fused=True), (last_position + depth).expand(-1, e),
                          region_mask(self.kv.mask, seen))
            node_h.scatter_(1, nodes[..., None].expand(-1, -1, h.shape[-1]), h)
            return self._distribution(h, sampling)

        raw, q = self._distribution(root_h, sampling)
        tree = grow_tree(raw, q, expand, self.branches, k, self.depth, sampling, generator)
        self.n_drafted = region.n_fed
        n_proposed = torch.full((B,), tree.tokens.shape[1], dtype=torch.long, device=device)
        return Proposal(tokens=tree.tokens, probs=tree.probs, n_proposed=n_proposed, parents=tree.parents)

    @torch.inference_mode()  # the cache is made (an inference tensor) at the first proposal
    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        # Drafted entries read the head's own features: the accepted tokens return next round with the target's.
        self.kv.drop_last(torch.full_like(n_accepted, self.n_drafted), length=self.fed_end)
        self.n_drafted = 0


def head_folder(head: str) -> Path:
    """A shipped head's folder, a local folder, or a hub name's download (huggingface_hub, as transformers
    fetches models; offline, only what its cache holds)."""
    folder = SHIPPED.get(head, Path(head).expanduser())
    if head in SHIPPED and not folder.is_dir():
        raise UserInputError(f"no '{head}' head ships in this install; give a head folder "
                             f"(python -m specexp.distill student={head})")
    if folder.is_dir() or head in SHIPPED or head.startswith((".", "/", "~")) or head.count("/") != 1:
        return folder
    from huggingface_hub import snapshot_download  # a hub name: org/name

    try:
        return Path(snapshot_download(head, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as error:  # offline, unknown, gated: one line saying which
        raise UserInputError(f"draft.head={head} is not a local folder and could not be fetched from the hub "
                             f"({type(error).__name__}); give a folder or a hub name that can be reached") from None


def resolve_head(target: LoadedModel, head: str) -> EagleHead | Eagle3Head:
    """The EAGLE head ``head`` names: a shipped one (trained for the default target), a folder or a hub
    name. A folder with a config.json is EAGLE-3 as published (speculators' format, or the EAGLE / SpecForge
    layout); one with eagle_head.json is specexp's earlier variant (EAGLE-1 / EAGLE-3 through one fc)."""
    folder = head_folder(head)
    loaded = Eagle3Head.load(folder, target) if is_eagle3_folder(folder) else EagleHead.load(folder, target)
    return loaded.to(target.model.device, target.model.dtype)


def eagle_drafter(target: LoadedModel, head: str = "eagle3", k: int = 4, branches: int = 1,
                  depth: int | None = None, quantize: str | None = None) -> EagleDrafter:
    """`draft=eagle`: draft.head = eagle3 (shipped for the default target) | a head folder;
    draft.quantize = int8 | auto: the head's bias-free linears (fusion, the layer's projections,
    its own LM head) in int8 on a CPU (`drafts/parts/quantize.py`), as for a small-LM draft."""
    loaded = quantize_linears(resolve_head(target, str(head)), quantize, in_place=True)  # loaded for this draft only
    return EagleDrafter(target, loaded, k=k, branches=branches, depth=depth)
