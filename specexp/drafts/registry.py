"""The registry of drafts: every `conf/draft/NAME.yaml` (and a user's, in a folder added with
`hydra.searchpath` or `--config-dir`), each with the card it declares under `card:`.

The card is what the rest of specexp and its tests read about a draft, so that a new draft is its
strategy's file and this YAML: its label and colour in figures, which config keys name a variant,
whether `python -m specexp.pairing` ranks it by default, which distillation trains its weights,
the options a K policy takes over, and for the tests its exactness-grid case and the bad options
it must refuse in one line. Nothing here is passed to the draft's constructor (drafts/build.py)."""

import functools
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specexp.errors import UserInputError
from specexp.paths import CONFIG_DIR

CARD_KEYS = {"label", "colour", "variants", "pairing", "trained_by", "with_k_policy", "tests"}
TESTS_KEYS = {"exactness", "bad_options"}
DESCRIBING_KEYS = ("name", "card")  # what reports call a draft and what specexp reads of it: no constructor's arguments
K_KEYS = ("k", "k_max")  # how many tokens a round drafts: the build and the K policy read them
TESTS_ONLY = "card.tests"  # what a card says for the test suite only, not a job's setting


def draft_name(draft_cfg: DictConfig | dict) -> str:
    """The config's `name` (conf/draft/NAME.yaml's); a config without one: its _target_'s last part."""
    return str(draft_cfg.get("name") or str(draft_cfg.get("_target_", "")).rsplit(".", 1)[-1])


@dataclass(frozen=True)
class DraftCard:
    name: str  # the config's name (conf/draft/NAME.yaml), a study's summary["draft"]
    label: str  # its name in figures' legends and tables
    colour: str | None = None  # a matplotlib colour for every figure; None: the next of the palette
    # config keys whose values make a variant figures tell apart (early_exit: head, mode)
    variants: tuple[str, ...] = ()
    pairing: bool = False  # `python -m specexp.pairing` ranks it when --drafts is not given
    # student -> the draft's key its exported folder goes in: `python -m specexp.distill student=S` trains it
    trained_by: dict = field(default_factory=dict)
    with_k_policy: dict = field(default_factory=dict)  # its options a K policy sets where the config leaves them unset
    # card.tests, read by tests/ only: how the exactness grid builds it for a tiny target ({"overrides": {...}}
    # of its config, with {other} / {lm} / {store} for a same-vocabulary model folder and the n-gram files;
    # {"case": NAME} of tests/drafters.py; {"none": WHY} where another test covers it), and the options it
    # must refuse in one line ([{"set": {...}, "error": TEXT}], with {target} / {lm} / {store})
    exactness: dict = field(default_factory=dict)
    bad_options: tuple[dict, ...] = ()


def card_of(draft_cfg: DictConfig | dict, name: str | None = None) -> DraftCard:
    """The card a composed draft config declares (a config without one: its name and nothing else)."""
    plain = OmegaConf.to_container(draft_cfg, resolve=False) if isinstance(draft_cfg, DictConfig) else dict(draft_cfg)
    name = name or draft_name(plain)
    card = plain.get("card") or {}
    tests = card.get("tests") or {}
    for prefix, given, allowed in (("card", card, CARD_KEYS), ("card.tests", tests, TESTS_KEYS)):
        if unknown := set(given) - allowed:
            raise UserInputError(f"draft={name}: {prefix}.{sorted(unknown)[0]} is not a field of it; allowed: "
                                 f"{', '.join(sorted(allowed))}")
    return DraftCard(name=name, label=str(card.get("label") or name), colour=card.get("colour"),
                     variants=tuple(card.get("variants") or ()), pairing=bool(card.get("pairing", False)),
                     trained_by=dict(card.get("trained_by") or {}), with_k_policy=dict(card.get("with_k_policy") or {}),
                     exactness=dict(tests.get("exactness") or {}), bad_options=tuple(tests.get("bad_options") or ()))


def draft_names(config_dirs: tuple[str, ...] = ()) -> list[str]:
    """Every draft config's name: the shipped ones and those in ``config_dirs``' draft/ folders."""
    return sorted({p.stem for root in (CONFIG_DIR, *config_dirs) for p in (Path(root) / "draft").glob("*.yaml")})


def draft_config(name: str, config_dirs: tuple[str, ...] = ()) -> DictConfig:
    """conf/draft/NAME.yaml (or a user folder's) with the drafts it extends merged under it (a default
    that names another draft of the group, as distilled_confident extends distilled). Read with
    OmegaConf, not composed: a running Hydra app (python -m specexp.distill) may ask."""
    path = next((Path(root) / "draft" / f"{name}.yaml" for root in (*config_dirs, CONFIG_DIR)
                 if (Path(root) / "draft" / f"{name}.yaml").is_file()), None)
    if path is None:
        raise UserInputError(f"unknown draft '{name}'; allowed: {', '.join(draft_names(config_dirs))}")
    own = OmegaConf.load(path)
    parents = [d for d in own.pop("defaults", []) if isinstance(d, str) and d != "_self_" and "/" not in d]
    return OmegaConf.merge(*(draft_config(parent, config_dirs) for parent in parents), own)


@functools.cache
def draft_cards(config_dirs: tuple[str, ...] = ()) -> dict[str, DraftCard]:
    """name -> card of every registered draft."""
    return {name: card_of(draft_config(name, config_dirs), name) for name in draft_names(config_dirs)}


def pairing_drafts() -> list[str]:
    """The drafts `python -m specexp.pairing` ranks by default (their cards' `pairing: true`)."""
    return [name for name, card in draft_cards().items() if card.pairing]


def use_line(student: str, folder: str) -> str | None:
    """How a study uses what `python -m specexp.distill student=STUDENT` exported to ``folder``: the
    draft whose card says it is trained by that student, and the key the folder goes in."""
    for name, card in draft_cards().items():
        if student in card.trained_by:
            return f"python -m specexp draft={name} draft.{card.trained_by[student]}={folder}"
    return None
