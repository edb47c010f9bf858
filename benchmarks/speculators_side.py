"""The speculators side of benchmarks/speculators_check.py: runs in a venv of its own with speculators 0.7.0
and its pinned transformers (benchmarks/speculators_check.sh builds it), imports nothing of specexp.

    python speculators_side.py build --verifier DIR --out HEAD --inputs IN.pt --logits OUT.pt [--flags ...]
    python speculators_side.py load --head HEAD --inputs IN.pt --logits OUT.pt --keys KEYS.json

build: a random EAGLE-3 speculator for the verifier in DIR with speculators' own classes (a draft
vocabulary of --draft-vocab sorted random ids, the norm flags given), saved with save_pretrained, and its
logits on IN.pt. load: Eagle3DraftModel.from_pretrained(HEAD), the safetensors keys against its
state_dict (missing, unexpected), and its logits on IN.pt. The logits are the first draft step's at every
position: features [1, T, 3H] at positions 0..T-1 with the next tokens [1, T] (fp32, causal attention).
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from transformers import AutoConfig


@torch.no_grad()
def first_step_logits(model: Eagle3DraftModel, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """What Eagle3DraftModel.forward computes in its first step, its logits kept: [1, T, draft vocab]."""
    hidden = features.to(model.fc.weight.dtype)
    if model.input_norm is not None:
        hidden = model.input_norm(hidden)
    if model.fc_norm is not None:
        hidden = torch.cat([norm(c) for norm, c in zip(model.fc_norm, hidden.chunk(len(model.fc_norm), -1),
                                                       strict=True)], dim=-1)
    hidden = torch.cat([model.embed_tokens(tokens), model.fc(hidden)], dim=-1)  # [1, T, 2H]
    T = tokens.shape[1]
    positions = torch.arange(T)[None]
    causal = torch.full((T, T), torch.finfo(hidden.dtype).min).triu(1)[None, None]  # additive, [1, 1, T, T]
    embeddings = model.rotary_emb(hidden, positions)
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = "eager"  # noqa: SLF001 (flex attention needs a compiler on a CPU)
        hidden = layer(hidden, attention_mask=causal, position_ids=positions, position_embeddings=embeddings)
    return model.lm_head(model.norm(hidden))


def build(args: argparse.Namespace) -> None:
    verifier = AutoConfig.from_pretrained(args.verifier)
    verifier._attn_implementation = "eager"  # noqa: SLF001 (flex attention needs a compiler on a CPU)
    n = verifier.num_hidden_layers
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=verifier, draft_vocab_size=args.draft_vocab,
        norm_before_residual=args.norm_before_residual, norm_before_fc=args.norm_before_fc,
        norm_output=args.norm_output,
        eagle_aux_hidden_state_layer_ids=[2, n // 2, n - 3],
        speculators_config=SpeculatorsConfig(algorithm="eagle3", default_proposal_method="greedy",
                                             proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                                             verifier=VerifierConfig.from_pretrained(args.verifier)))
    config.transformer_layer_config.num_hidden_layers = 1
    torch.manual_seed(0)
    model = Eagle3DraftModel(config=config).float()
    ids = torch.randperm(verifier.vocab_size)[: args.draft_vocab].sort().values
    t2d = torch.zeros(verifier.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(args.draft_vocab))
    with torch.no_grad():  # random where speculators leaves NaN until it copies the verifier's
        weights = load_file(Path(args.verifier) / "model.safetensors")
        model.embed_tokens.weight.copy_(weights["model.embed_tokens.weight"])
        model.lm_head.weight.normal_(0, 0.05)
        for module in model.modules():  # the norms away from 1, so a mixed-up norm shows
            if "RMSNorm" in type(module).__name__:
                module.weight.uniform_(0.5, 1.5)
    model.save_pretrained(args.out)
    inputs = torch.load(args.inputs)
    torch.save(first_step_logits(model.eval(), inputs["features"], inputs["tokens"]), args.logits)


def load(args: argparse.Namespace) -> None:
    model = Eagle3DraftModel.from_pretrained(args.head).float().eval()
    file_keys = set()
    for file in Path(args.head).glob("*.safetensors"):
        file_keys |= set(load_file(file))
    state = set(model.state_dict()) - {k for k in model.state_dict() if k.startswith("verifier_")}
    ignored = set(model._keys_to_ignore_on_load_missing)  # noqa: SLF001
    Path(args.keys).write_text(json.dumps({"missing": sorted(state - file_keys - ignored),
                                           "unexpected": sorted(file_keys - state)}))
    inputs = torch.load(args.inputs)
    torch.save(first_step_logits(model, inputs["features"], inputs["tokens"]), args.logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--verifier", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--draft-vocab", type=int, default=8192)
    for flag in ("norm_before_residual", "norm_before_fc", "norm_output"):
        b.add_argument(f"--{flag.replace('_', '-')}", action="store_true")
    lo = sub.add_parser("load")
    lo.add_argument("--head", required=True)
    lo.add_argument("--keys", required=True)
    for p in (b, lo):
        p.add_argument("--inputs", required=True)
        p.add_argument("--logits", required=True)
    args = parser.parse_args()
    build(args) if args.command == "build" else load(args)


if __name__ == "__main__":
    main()
