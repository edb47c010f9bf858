"""`python -m specexp.export HEAD_DIR --format speculators --out DIR`: an EAGLE-3 head in the format vLLM
serves (the command; the format is drafts/parts/eagle3_format.py)."""

import argparse
import sys
from pathlib import Path

import torch

from specexp.cli import CommandParser, one_line_errors
from specexp.drafts.parts.eagle3_format import is_eagle3_folder, read_folder, write_speculators
from specexp.errors import UserInputError

DESCRIPTION = """An EAGLE-3 head as published (one trained here with `python -m specexp.distill student=eagle3`,
a speculators folder, or the EAGLE authors' / SpecForge layout) written in the speculators format that
vLLM serves: config.json (speculators_config with its verifier) and model.safetensors (fc, layers.0.*,
norm, lm_head, d2t, t2d), its floating weights in --dtype (as stored if not given). --verifier names the
target where vLLM will find it (a hub name or a folder): a head trained here names the target as specexp
loaded it. Serve it with
`vllm serve VERIFIER --speculative-config '{"model": "DIR", "num_speculative_tokens": K, "method": "eagle3"}'`."""


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(prog="python -m specexp.export", description=DESCRIPTION)
    parser.add_argument("head", type=Path, help="the head's folder")
    parser.add_argument("--format", choices=["speculators"], default="speculators", help="the format written")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (must not exist)")
    parser.add_argument("--verifier", default=None, help="the target's hub name or folder, as vLLM will load it")
    parser.add_argument("--speculative-tokens", type=int, default=None, help="the proposal length to serve it at")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="the weights' floating type (default: as stored; vLLM serves bfloat16 heads)")
    parser.add_argument("--no-embedding", action="store_true",
                        help="leave the token embedding out (vLLM and specexp take the target's; speculators needs it)")
    return parser.parse_args(argv)


def export(head: Path, out: Path, verifier: str | None = None, speculative_tokens: int | None = None,
           embedding: bool = True, dtype: str | None = None) -> None:
    """The head folder ``head`` in the speculators format at ``out`` (``embedding``: with its token embedding;
    ``dtype``: its floating weights cast, d2t / t2d kept)."""
    if not head.is_dir():
        raise UserInputError(f"head folder '{head}' does not exist")
    if not is_eagle3_folder(head):
        raise UserInputError(f"'{head}' is not an EAGLE-3 head as published (it has no config.json; a folder with "
                             f"eagle_head.json is specexp's earlier variant: retrain it with student=eagle3)")
    if out.exists():
        raise UserInputError(f"--out {out} exists; give a new folder")
    if speculative_tokens is not None and speculative_tokens < 1:
        raise UserInputError(f"--speculative-tokens {speculative_tokens} is not allowed; give K >= 1")
    found = read_folder(head)
    if verifier is not None:
        found.verifier = {"name_or_path": verifier, "architectures": (found.verifier or {}).get("architectures", [])}
    if found.verifier is None:
        raise UserInputError(f"'{head}' names no verifier (the EAGLE / SpecForge layout does not): give --verifier")
    found.speculative_tokens = speculative_tokens or found.speculative_tokens
    weights = {k: w for k, w in found.weights.items() if embedding or k != "embed_tokens.weight"}
    if dtype is not None:
        weights = {k: w.to(DTYPES[dtype]) if w.is_floating_point() else w for k, w in weights.items()}
        found.layer_config = found.layer_config | {"dtype": dtype}
    write_speculators(out, found, weights)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with one_line_errors():
        export(args.head, args.out, args.verifier, args.speculative_tokens, embedding=not args.no_embedding,
               dtype=args.dtype)
    print(f"wrote {args.out} (speculators format, verifier '{args.verifier or 'as trained'}')")


if __name__ == "__main__":
    main()
