"""Test-only drafts (a random one) and every draft strategy built for a tiny target, by name."""

import numpy as np
import torch

from specexp.core.interface import Context, Drafter, DraftTraits, Proposal
from specexp.core.k_policy import truncate
from specexp.core.sampling import SamplingConfig
from specexp.drafts.eagle import EagleDrafter
from specexp.drafts.early_exit import SharedEarlyExitDrafter, early_exit_drafter
from specexp.drafts.medusa import MedusaDrafter
from specexp.drafts.ngram_lm import NgramLMDrafter
from specexp.drafts.parts.quantize import quantize_linears
from specexp.drafts.prompt_lookup import PromptLookupDrafter
from specexp.drafts.registry import draft_cards
from specexp.drafts.retrieval import RetrievalDrafter
from specexp.drafts.small_lm import SmallLMDrafter, target_prefix_drafter, top_probability
from specexp.models import LoadedModel
from tests.conftest import EOS, random_exit_head, reduced_vocab_copy


class RandomDrafter:
    """Proposes uniformly random tokens with q = uniform: agrees with the target by chance only."""

    def __init__(self, vocab_size: int, k: int):
        self.traits, self.vocab_size = DraftTraits(k_max=k), vocab_size

    def reset(self, ctx: Context) -> None:
        pass

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator) -> Proposal:
        B = ctx.tokens.shape[0]
        tokens = torch.randint(self.vocab_size, (B, k), generator=generator)
        probs = torch.full((B, k, self.vocab_size), 1.0 / self.vocab_size)
        return Proposal(tokens=tokens, probs=probs, n_proposed=torch.full((B,), k))

    def update(self, ctx: Context, proposal: Proposal, n_accepted: torch.Tensor) -> None:
        pass


class ScriptedK:
    """Asks each round for a K drawn at random from 0..k_max (0: no draft) and keeps a random
    prefix of what was proposed: any choice a K policy can make."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def begin(self, batch_size, k_max, max_new_tokens):
        self.k_max, self.first = k_max, [0, k_max, 0]  # every K the test names comes early

    def choose(self, ctx):
        return self.first.pop(0) if self.first else int(self.rng.integers(0, self.k_max + 1))

    def shorten(self, proposal, ctx):
        return truncate(proposal, int(self.rng.integers(0, proposal.tokens.shape[1] + 1)))

    def observe(self, seen):
        pass


def confidence_quantile(draft: LoadedModel, quantile: float = 0.5) -> float:
    """A quantile of the draft's top probability on random contexts: a min_confidence at which its
    rows stop drafting at some steps and not at others."""
    x = torch.randint(1, draft.vocab_size, (4, 30), generator=torch.Generator().manual_seed(0))
    vocab = draft.draft_vocab
    with torch.no_grad():
        logits = draft.model(x if vocab is None else vocab.to_draft(x)).logits
    confidence = top_probability(logits if vocab is None else logits[..., : vocab.size])
    return float(confidence.quantile(quantile))


def distilled_like(target: LoadedModel, other: LoadedModel, k: int) -> SmallLMDrafter:
    """What `draft=distilled` / `distilled_confident` build for the default target, for a tiny one:
    a reduced-vocabulary draft with int8 weights that stops rows at a confidence threshold."""
    draft = reduced_vocab_copy(other)
    return SmallLMDrafter(target, draft, k=k, min_confidence=confidence_quantile(draft), quantize="int8")


class RecordsProposals:
    """Mixin for a feature draft: keeps, per round, each row's committed tokens and features and
    what it proposed (tokens, q)."""

    def propose(self, ctx: Context, k: int, sampling: SamplingConfig, generator) -> Proposal:
        proposal = super().propose(ctx, k, sampling, generator)
        rows = [(int(s), int(n)) for s, n in zip(ctx.start, ctx.lengths, strict=True)]
        self.__dict__.setdefault("rounds", []).append(
            [(ctx.tokens[b, s:n].clone(), ctx.features[b, s:n].clone(), proposal.tokens[b].clone(),
              proposal.probs[b].clone()) for b, (s, n) in enumerate(rows)])
        return proposal


def fit_feature_head(target: LoadedModel, head, steps: int):
    """``steps`` Adam steps of the training loss, teacher-forced on random sequences: enough for a
    tiny target's greedy drafts to be accepted at times."""
    from specexp.distill.features import prediction_losses, teacher_pass
    from specexp.distill.objectives import objective

    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(2, target.vocab_size, (8, 24), generator=g)
        teacher_logits, features = teacher_pass(target.model, ids, head.hidden_layers)
        predictions = head.predictions(ids, features)
        losses = prediction_losses(head, predictions, teacher_logits, objective("forward_kl"), 1.0)
        optimizer.zero_grad()
        sum(p.weight * loss for p, loss in zip(predictions, losses, strict=True)).backward()
        optimizer.step()
    return head.eval()


def every_other_token(target: LoadedModel, keep_every: int | None):
    """A draft vocabulary of every keep_every-th id + EOS (None: the target's)."""
    from specexp.draft_vocab import DraftVocab

    if not keep_every:
        return None
    return DraftVocab(sorted(set(range(0, target.vocab_size, keep_every)) | {EOS}), target.vocab_size)


def eagle_head(target: LoadedModel, hidden_layers: tuple[int, ...], keep_every: int | None = None, steps: int = 150):
    """An EAGLE head for a tiny target, briefly fitted with two unrolled steps; with ``keep_every``
    a reduced vocabulary and its own head. Exactness holds for any head."""
    from specexp.drafts.parts.eagle_head import EagleHead

    key = ("eagle", target.name, tuple(hidden_layers), keep_every, steps)
    if key not in _FITTED:
        torch.manual_seed(0)
        head = EagleHead(target, tuple(hidden_layers), draft_vocab=every_other_token(target, keep_every))
        head.unroll_steps = 2
        _FITTED[key] = fit_feature_head(target, head, steps)
    return _FITTED[key]


def eagle3_head(target: LoadedModel, keep_every: int | None = 2, steps: int = 150, **flags):
    """An EAGLE-3 head as published for a tiny target, over its hidden states 0, 1 and 2, briefly fitted with
    two unrolled steps; ``flags``: its norm flags."""
    from specexp.drafts.parts.eagle3_head import Eagle3Head

    key = ("eagle3", target.name, keep_every, steps, tuple(sorted(flags.items())))
    if key not in _FITTED:
        torch.manual_seed(0)
        head = Eagle3Head(target, (0, 1, 2), every_other_token(target, keep_every), **flags)
        head.unroll_steps = 2
        _FITTED[key] = fit_feature_head(target, head, steps)
    return _FITTED[key]


def medusa_heads(target: LoadedModel, n_heads: int = 4, keep_every: int | None = None, steps: int = 150):
    """Medusa heads for a tiny target, briefly fitted."""
    from specexp.drafts.parts.medusa_heads import MedusaHeads

    key = ("medusa", target.name, n_heads, keep_every, steps)
    if key not in _FITTED:
        torch.manual_seed(0)
        _FITTED[key] = fit_feature_head(target, MedusaHeads(target, None, every_other_token(target, keep_every),
                                                            n_heads), steps)
    return _FITTED[key]


_FITTED = {}  # one fit per tiny target and recipe for the whole session


# Every draft strategy (and its options that change what is proposed), built for a tiny target:
# `other` is a model of the same vocabulary that agrees with it part of the time, `files` the
# n-gram LM and datastore of tests.conftest.build_ngram_files.
DRAFT_KINDS = {
    "agree": lambda target, other, k, files: SmallLMDrafter(target, target, k=k),
    "disagree": lambda target, other, k, files: SmallLMDrafter(target, other, k=k),
    "random": lambda target, other, k, files: RandomDrafter(target.vocab_size, k),
    "prompt_lookup": lambda target, other, k, files: PromptLookupDrafter(target, k=k, max_n=3, min_n=1),
    "prompt_lookup_tree": lambda target, other, k, files: PromptLookupDrafter(
        target, k=k, max_n=3, min_n=1, max_tokens_after_match=[], branches=min(3, k)),
    "prompt_lookup_frequent": lambda target, other, k, files: PromptLookupDrafter(
        target, k=k, max_n=2, min_n=1, choice="frequent", max_tokens_after_match=[]),  # uncapped
    "ngram_lm": lambda target, other, k, files: NgramLMDrafter(target, files["lm"], k=k),
    "ngram_lm_tree": lambda target, other, k, files: NgramLMDrafter(target, files["lm"], k=k, branches=2),
    "ngram_lm_confident": lambda target, other, k, files: NgramLMDrafter(target, files["lm"], k=k, min_confidence=0.3),
    "retrieval": lambda target, other, k, files: RetrievalDrafter(target, files["store"], k=k, combine_context=False),
    "retrieval+context": lambda target, other, k, files: RetrievalDrafter(target, files["store"], k=k, max_match=4,
                                                                          context_max_n=3),
    "retrieval_confident": lambda target, other, k, files: RetrievalDrafter(target, files["store"], k=k,
                                                                            min_confidence=0.5),
    "reduced_vocab": lambda target, other, k, files: SmallLMDrafter(target, reduced_vocab_copy(other), k=k),
    "small_lm_tree": lambda target, other, k, files: SmallLMDrafter(target, other, k=k, branches=2),
    "reduced_vocab_tree": lambda target, other, k, files: SmallLMDrafter(target, reduced_vocab_copy(other), k=k,
                                                                         branches=3, depth=2),
    "small_lm_confident": lambda target, other, k, files: SmallLMDrafter(target, other, k=k,
                                                                         min_confidence=confidence_quantile(other)),
    "small_lm_int8": lambda target, other, k, files: SmallLMDrafter(target, other, k=k, quantize="int8"),
    "target_prefix": lambda target, other, k, files: target_prefix_drafter(target, n_layers=1, k=k),
    "distilled_like": lambda target, other, k, files: distilled_like(target, other, k),
    "early_exit_shared": lambda target, other, k, files: early_exit_drafter(target, exit_layer=1, k=k, mode="shared"),
    "early_exit_naive": lambda target, other, k, files: early_exit_drafter(target, exit_layer=1, k=k, mode="naive"),
    "early_exit_trained": lambda target, other, k, files: SharedEarlyExitDrafter(
        target, random_exit_head(target, 1), k=k),
    # fitted less: a head close to the 8-token target leaves the residual control too little to catch at K = 1
    "eagle": lambda target, other, k, files: EagleDrafter(target, eagle_head(target, (2,), steps=40), k=k),
    "eagle3_reduced_vocab": lambda target, other, k, files: EagleDrafter(
        target, eagle_head(target, (0, 1, 2), keep_every=2), k=k),
    "eagle_tree": lambda target, other, k, files: EagleDrafter(target, eagle_head(target, (1, 2)), k=k,
                                                               branches=2),
    "medusa": lambda target, other, k, files: MedusaDrafter(target, medusa_heads(target, n_heads=max(k, 2)), k=k),
    "medusa_tree_reduced_vocab": lambda target, other, k, files: MedusaDrafter(
        target, medusa_heads(target, n_heads=3, keep_every=2), k=k, branches=2),
    # EAGLE-3 as published: the 2H-wide layer, d2t / t2d; with speculators' training flags; as a dynamic tree
    "eagle3_published": lambda target, other, k, files: EagleDrafter(target, eagle3_head(target), k=k),
    "eagle3_published_flags": lambda target, other, k, files: EagleDrafter(
        target, eagle3_head(target, keep_every=None, norm_before_residual=True, norm_before_fc=True,
                            norm_output=True), k=k),
    "eagle3_published_tree": lambda target, other, k, files: EagleDrafter(target, eagle3_head(target), k=k, branches=2),
    # a copy of the fitted published head with int8 linears (draft.quantize=int8 swaps them in a freshly loaded head)
    "eagle3_int8": lambda target, other, k, files: EagleDrafter(target, quantize_linears(eagle3_head(target), "int8"),
                                                                k=k),
}


def config_builder(name: str, overrides: dict, config_dirs: tuple[str, ...] = ()):
    """A DRAFT_KINDS builder of ``draft=NAME`` as a study builds it from its YAML (drafts/build.py), at
    a fixed K, with ``overrides`` (its card's exactness.overrides) set; ``{other}`` in a value is a
    folder holding the same-vocabulary model, ``{lm}`` / ``{store}`` the n-gram files."""
    def build(target, other, k, files):
        from hydra import compose, initialize_config_dir

        from specexp.drafts.build import build_draft
        from specexp.paths import CONFIG_DIR

        searchpath = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in config_dirs)}]"] if config_dirs else []
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose("config", overrides=[f"draft={name}", f"draft.k={k}", *searchpath])
        names = {"other": saved_folder(other), **files}
        for key, value in overrides.items():
            cfg.draft[key] = value.format(**names) if isinstance(value, str) else value
        return build_draft(cfg.draft, target).drafter
    return build


def saved_folder(model: LoadedModel) -> str:
    """A folder holding ``model`` (saved once per model), as a user's draft.model=PATH."""
    import tempfile

    if id(model) not in _SAVED:
        folder = tempfile.mkdtemp(prefix="draft-model-")
        model.model.save_pretrained(folder)
        _SAVED[id(model)] = (model, folder)  # the model kept alive: its id is not reused
    return _SAVED[id(model)][1]


_SAVED = {}


def grid_cases(cards) -> tuple[dict[str, str], dict[str, str]]:
    """From the drafts' cards (drafts/registry.py): each config's exactness-grid kind (a DRAFT_KINDS case, or
    ``config:NAME`` built from its YAML) and, for those the sampled grid leaves out, the reason and the test
    that covers them instead."""
    in_grid, left_out = {}, {}
    for name, card in cards.items():
        if "none" in card.exactness:
            left_out[name] = card.exactness["none"]
        elif "case" in card.exactness:
            in_grid[name] = card.exactness["case"]
        elif "overrides" in card.exactness:
            in_grid[name] = f"config:{name}"
    return in_grid, left_out


# The exactness grid's case for each registered draft config (conf/draft/NAME.yaml's card.tests.exactness;
# tests/test_exactness.py fails for a config that declares none), and the shipped configs the grid builds
# from their own YAML.
GRID_CASE_OF_CONFIG, NOT_IN_THE_SAMPLED_GRID = grid_cases(draft_cards())
DRAFT_KINDS |= {kind: config_builder(name, draft_cards()[name].exactness["overrides"])
                for name, kind in GRID_CASE_OF_CONFIG.items() if kind == f"config:{name}"}


def make_drafter(kind: str, target: LoadedModel, other: LoadedModel, k: int, files: dict[str, str]) -> Drafter:
    return DRAFT_KINDS[kind](target, other, k, files)
