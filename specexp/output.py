"""How specexp writes what it makes: files written whole or not at all, the short hashes that name
cached files, and markdown tables. A leaf module: every layer that writes results or caches uses it."""

import hashlib
import json
import os
from pathlib import Path

import pandas as pd


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name beside ``path``, then rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def short_hash(value: object) -> str:
    """16 hex digits of the sha256 of anything JSON can write (keys sorted): names a cached file by
    what it was made from."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def markdown_table(table: pd.DataFrame, digits: int = 3) -> str:
    """A DataFrame as a GitHub markdown table (floats to `digits` places, missing as '-')."""
    def cell(v) -> str:
        return f"{v:.{digits}f}" if isinstance(v, float) and v == v else ("-" if v is None or v != v else str(v))

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"
