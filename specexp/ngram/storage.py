"""One-file storage for corpus-built drafts: numpy arrays plus a JSON header."""

import json
from pathlib import Path

import numpy as np

from specexp.errors import UserInputError


def save_npz(path: str | Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """One file: the arrays plus a JSON header; written to a temp name, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    tmp.replace(path)


def load_npz(path: str | Path, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    path = Path(path).expanduser()
    if not path.exists():
        raise UserInputError(f"{kind} file '{path}' does not exist; build one with python -m specexp.ngram")
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    meta = json.loads(arrays.pop("__meta__").tobytes())
    if meta.get("kind") != kind:
        raise UserInputError(f"'{path}' holds a {meta.get('kind')} model, not a {kind} one")
    return meta, arrays
