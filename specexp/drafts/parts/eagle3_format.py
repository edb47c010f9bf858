"""The folders EAGLE-3 heads come in, read and written: the speculators format (what vLLM serves and
vllm-project/speculators trains and converts) and the EAGLE authors' / SpecForge layout.

- speculators: `config.json` with ``speculators_model_type: eagle3``, ``speculators_config``
  (``algorithm``, ``proposal_methods``, ``default_proposal_method``, ``verifier`` {``name_or_path``,
  ``architectures``}), ``transformer_layer_config`` (the decoder layer's Llama config),
  ``draft_vocab_size``, ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` (hidden-state
  indices of the target: 0 the embeddings, k the stream entering layer k) and the norm flags; weights
  ``fc``, ``input_norm`` / ``fc_norm.{0,1,2}``, ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``
  (``embed_tokens`` optional).
- EAGLE / SpecForge: a Llama `config.json` with ``architectures: [LlamaForCausalLMEagle3]`` and
  ``draft_vocab_size``, its layer named ``midlayer.*``; SpecForge's ``eagle_config.
  eagle_aux_hidden_state_layer_ids`` count layer outputs (one less than hidden-state indices).

Either is read into one `Eagle3Folder` in speculators' weight names.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from specexp.errors import UserInputError

SPECULATORS_VERSION = "0.7.0"  # the format version written (what vLLM and speculators 0.7.0 read)
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
EAGLE_ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass
class Eagle3Folder:
    """What a head folder holds, whatever its layout."""

    layer_config: dict  # the decoder layer's Llama config (transformer_layer_config, or the EAGLE config)
    draft_vocab_size: int
    aux_layers: tuple[int, ...] | None  # the target's hidden-state indices it reads; None: the published default
    target_hidden_size: int | None  # the target's width where it differs from the head's
    flags: dict[str, bool]  # FLAGS
    verifier: dict | None  # {name_or_path, architectures}: the target it was trained for, where given
    weights: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)  # in speculators' names
    layout: str = "speculators"  # or "eagle"
    speculative_tokens: int | None = None  # the proposal length it was published for


def weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserInputError(f"EAGLE-3 head '{folder}' has no .safetensors weights")
    return files


def read_folder(folder: str | Path) -> Eagle3Folder:
    """A speculators-format or EAGLE / SpecForge folder (detected from its config.json)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    speculators = config.get("speculators_model_type") == "eagle3"
    if not speculators and EAGLE_ARCHITECTURE not in (config.get("architectures") or []):
        raise UserInputError(f"'{folder}' is not an EAGLE-3 head: its config.json has neither speculators_model_type: "
                             f"eagle3 (the speculators format) nor architectures [{EAGLE_ARCHITECTURE}] "
                             f"(EAGLE / SpecForge)")
    weights = {}
    for file in weight_files(folder):
        weights |= load_file(file)
    if speculators:
        method = next(iter(config.get("speculators_config", {}).get("proposal_methods") or [{}]))
        return Eagle3Folder(layer_config=config["transformer_layer_config"],
                            draft_vocab_size=config["draft_vocab_size"],
                            aux_layers=tuple(config["eagle_aux_hidden_state_layer_ids"])
                            if config.get("eagle_aux_hidden_state_layer_ids") else None,
                            target_hidden_size=config.get("target_hidden_size"),
                            flags={flag: bool(config.get(flag, False)) for flag in FLAGS},
                            verifier=config.get("speculators_config", {}).get("verifier"), weights=weights,
                            speculative_tokens=method.get("speculative_tokens"))
    capture = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    renamed = {name.replace("midlayer.", "layers.0.", 1): w for name, w in weights.items()}
    flags = {flag: False for flag in FLAGS} | {"fc_norm": bool(config.get("fc_norm", False))}
    return Eagle3Folder(layer_config=config, draft_vocab_size=config.get("draft_vocab_size", config["vocab_size"]),
                        aux_layers=None if capture is None else tuple(j + 1 for j in capture),  # layer outputs
                        target_hidden_size=config.get("target_hidden_size"), flags=flags, verifier=None,
                        weights=renamed, layout="eagle")


def is_eagle3_folder(folder: Path) -> bool:
    """Whether a folder holds a published-format head (a config.json), not specexp's earlier eagle_head.json."""
    return (folder / "config.json").is_file()


def write_speculators(folder: str | Path, head: Eagle3Folder, weights: dict[str, torch.Tensor]) -> None:
    """The speculators format vLLM loads: config.json and model.safetensors."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokens = head.speculative_tokens or 3
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": head.verifier,
        },
        "transformer_layer_config": head.layer_config,
        "draft_vocab_size": head.draft_vocab_size,
        "target_hidden_size": head.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(head.aux_layers) if head.aux_layers is not None else None,
        **head.flags,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "transformers_version": transformers.__version__,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({name: w.contiguous() for name, w in weights.items()}, folder / "model.safetensors")
