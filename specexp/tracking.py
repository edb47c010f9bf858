"""Where results go. Local files always; every write is atomic or an append of whole lines."""

import json
import os
from pathlib import Path

import pandas as pd


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class LocalResults:
    """A run's folder: answers.jsonl grows per batch; summary.json and rounds.parquet land at the end."""

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.answers_path = self.out_dir / "answers.jsonl"
        self.answers_path.write_text("")

    def write_config(self, config_yaml: str) -> None:
        write_atomic(self.out_dir / "config.yaml", config_yaml.encode())

    def add_answers(self, rows: list[dict]) -> None:
        with self.answers_path.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
            f.flush()

    def finish(self, summary: dict, rounds: pd.DataFrame) -> None:
        tmp = self.out_dir / "rounds.parquet.tmp"
        rounds.to_parquet(tmp, index=False)
        os.replace(tmp, self.out_dir / "rounds.parquet")
        # summary.json last: its presence marks a complete run.
        write_atomic(self.out_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
