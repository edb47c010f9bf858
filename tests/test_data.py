"""Prompt sets through `datasets`."""

import json

import pandas as pd
import pytest

from specexp.data import Prompt, _subset, mt_bench, prompts_from_dataset, question_jsonl, spec_bench
from specexp.errors import UserInputError
from specexp.study.run import make_batches


def test_mt_bench_has_80_questions_in_8_categories():
    prompts = mt_bench(limit=None)
    assert len(prompts) == 80 and len({p.category for p in prompts}) == 8


def test_limit_spreads_over_categories_and_depends_on_seed():
    a, b = mt_bench(limit=8, seed=0), mt_bench(limit=8, seed=1)
    assert len({p.category for p in a}) == 8
    assert [p.id for p in a] != [p.id for p in b]
    assert [p.id for p in a] == [p.id for p in mt_bench(limit=8, seed=0)]


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_local_files_with_a_configurable_text_column(tmp_path, suffix):
    df = pd.DataFrame({"prompt": ["a b c", "d e", "f"], "topic": ["x", "y", "x"]})
    path = tmp_path / f"p.{suffix}"
    {"jsonl": lambda: df.to_json(path, orient="records", lines=True),
     "csv": lambda: df.to_csv(path, index=False), "parquet": lambda: df.to_parquet(path)}[suffix]()
    prompts = prompts_from_dataset(str(path), text_column="prompt", category_column="topic")
    assert [(p.text, p.category) for p in prompts] == [("a b c", "x"), ("d e", "y"), ("f", "x")]


def test_spec_bench_question_file_keeps_categories(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}", "second turn"]}
            for i, c in enumerate(["rag", "qa", "rag"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = question_jsonl(str(path))
    assert [(p.id, p.text, p.category) for p in prompts] == [("0", "q0", "rag"), ("1", "q1", "qa"), ("2", "q2", "rag")]


def test_spec_bench_ships_in_the_package_and_a_path_overrides_it(tmp_path):
    prompts = spec_bench()
    assert len(prompts) == 480 and len({p.id for p in prompts}) == 480
    counts = {c: sum(p.category == c for p in prompts) for c in {p.category for p in prompts}}
    assert all(counts[c] == 80 for c in ("translation", "summarization", "qa", "math_reasoning", "rag"))
    assert sum(counts.values()) - 5 * 80 == 80  # MT-bench's questions, in their 8 categories
    other = tmp_path / "question.jsonl"
    other.write_text(json.dumps({"question_id": 7, "category": "qa", "turns": ["why?"]}) + "\n")
    assert [(p.id, p.text) for p in spec_bench(str(other))] == [("7", "why?")]


def test_bad_column_and_missing_file_are_clear(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(UserInputError, match="column 'prompt' is not in"):
        prompts_from_dataset(str(path), text_column="prompt")
    with pytest.raises(UserInputError, match="does not exist"):
        prompts_from_dataset(str(tmp_path / "missing.jsonl"))


def test_batches_never_mix_categories():
    prompts = [Prompt(str(i), "t", c) for i, c in enumerate("aabbbac")]
    batches = make_batches(prompts, 2)
    assert all(len({prompts[i].category for i in b}) == 1 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(7))


def test_subset_is_round_robin_over_categories():
    prompts = [Prompt(str(i), "t", "a" if i < 6 else "b") for i in range(8)]
    chosen = _subset(prompts, 4, seed=0)
    assert sorted(p.category for p in chosen) == ["a", "a", "b", "b"]
