"""The one-time GGUF conversion with and without `models.gguf_parsed_once`, side by side in one process:

    python benchmarks/gguf_conversion.py [--model smollm2|gemma3] [--pairs 4] [--out benchmarks/gguf_conversion.md]

Each pair converts the same GGUF once each way into fresh folders, the order alternating from pair to
pair so drift hits both alike; the speedup is plain seconds / parsed-once seconds summed over the
pairs, with a 95% t interval on its log over pairs (specexp.study.intervals). Both ways write the same
files (checked on the first pair).
"""

import argparse
import contextlib
import filecmp
import tempfile
import time
from pathlib import Path

import numpy as np
from common import report_header, write_report
from tqdm import tqdm

from specexp import models
from specexp.study.intervals import MIN_UNITS, fmt_interval, log_t_interval

SOURCES = {"smollm2": lambda: (models.embedded_gguf_dir(), models.EMBEDDED_GGUF),
           "gemma3": lambda: (models.assembled_gemma3_gguf().parent, models.assembled_gemma3_gguf().name)}
WAYS = {"parsed_once": models.gguf_parsed_once, "plain": contextlib.nullcontext}


def convert(way: str, gguf_dir: Path, gguf_file: str, out: Path) -> float:
    """Seconds of one conversion, transformers' GGUF loads parsing once (`parsed_once`) or as they do."""
    real = models.gguf_parsed_once
    models.gguf_parsed_once = WAYS[way]  # what convert_gguf enters
    try:
        start = time.perf_counter()
        models.convert_gguf(gguf_dir, gguf_file, out)
        return time.perf_counter() - start
    finally:
        models.gguf_parsed_once = real


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and filecmp.cmpfiles(a, b, names, shallow=False)[0] == names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SOURCES), default="smollm2")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "gguf_conversion.md")
    args = parser.parse_args()
    gguf_dir, gguf_file = SOURCES[args.model]()
    seconds = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as scratch:
        for pair in tqdm(range(args.pairs), desc="conversion pairs"):
            order = list(WAYS) if pair % 2 == 0 else list(WAYS)[::-1]
            for way in order:
                seconds[way].append(convert(way, gguf_dir, gguf_file, Path(scratch) / f"{way}-{pair}"))
            if pair == 0 and not same_files(Path(scratch) / "parsed_once-0", Path(scratch) / "plain-0"):
                raise SystemExit("the two ways wrote different files")
    once, plain = np.array(seconds["parsed_once"]), np.array(seconds["plain"])
    interval = log_t_interval(plain, once) if len(once) >= MIN_UNITS else None  # a ratio of sums over pairs
    lines = report_header(f"GGUF conversion, {args.model}: parsing the file once") + [
        f"{args.pairs} pairs in one process, the order alternating; both ways wrote identical files.", "",
        "| pair | parsed once (s) | plain (s) | plain / parsed once |", "|---|---|---|---|",
        *(f"| {i} | {a:.2f} | {b:.2f} | {b / a:.2f} |" for i, (a, b) in enumerate(zip(once, plain, strict=True))), "",
        f"Speedup (sum plain / sum parsed once, 95% t interval on its log over pairs): "
        f"**{fmt_interval(plain.sum() / once.sum(), interval, 2)}**"]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
