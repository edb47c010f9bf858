"""Benchmark records hold what their scripts printed (issue 49): every benchmarks/*.md names, in its
first lines, the committed script whose output it is, and its hand-written notes interpret, adding no
number. Earlier sessions' notes with typed-in numbers live in docs/lab_notes/, not here."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BENCHMARKS = ROOT / "benchmarks"
RECORDS = sorted(path.name for path in BENCHMARKS.glob("*.md"))
HEADER_LINES = 8  # a record's title, machine and command come first


def scripts_named(header: str) -> list[str]:
    """The scripts a record's header runs: `python [.../]NAME.py ...` or `bash [.../]NAME.sh ...` in backticks."""
    return re.findall(r"`(?:cd \S+ && )?(?:python|bash) (?:\S*/)?([\w-]+\.(?:py|sh))\b", header)


def notes_of(text: str) -> str:
    """The hand-written part: from a '## Notes' heading to the next '## ' heading or the end."""
    found = re.search(r"^## Notes.*?$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    return found.group(1) if found else ""


def typed_numbers(notes: str) -> list[str]:
    """Numbers in notes outside `code` (commands, paths and commits may carry digits)."""
    prose = re.sub(r"`[^`]*`", "", notes)
    return re.findall(r"(?<![\w.])\d+(?:\.\d+)?", prose)


def test_typed_numbers_are_found_in_notes_and_code_is_not():
    text = "| a | 1.2 |\n\n## Notes (written after the run)\n\n- ran `python x.py --k 3` twice: 0.97 [0.95, 1.01]\n"
    assert typed_numbers(notes_of(text)) == ["0.97", "0.95", "1.01"]
    assert typed_numbers(notes_of("## Notes\n\n- see `issue 49`, commit `a77add1`.\n## Next\n1.0\n")) == []


def test_the_script_of_a_header_is_found():
    assert scripts_named("Written by: `python experiments/../benchmarks/study_record.py out --title x`") == \
        ["study_record.py"]
    assert scripts_named("- Written by `cd benchmarks && python pairing.py --prompts 4`.") == ["pairing.py"]
    assert scripts_named("Machine: x. Command: `python benchmarks/parity.py --runtime lean`.") == ["parity.py"]
    assert scripts_named("Machine: x (typed in: 1.2x)") == []


@pytest.mark.parametrize("record", RECORDS)
def test_a_record_names_its_script_and_adds_no_number_by_hand(record):
    text = (BENCHMARKS / record).read_text()
    header = "\n".join(text.splitlines()[:HEADER_LINES]) + "\n" + "\n".join(
        line for line in text.splitlines() if "Written by" in line)
    scripts = scripts_named(header)
    assert scripts, f"{record} does not name the script whose output it is (Written by: `python benchmarks/X.py ...`)"
    assert all((ROOT / "benchmarks" / s).is_file() or (ROOT / "experiments" / s).is_file() for s in scripts), scripts
    assert typed_numbers(notes_of(text)) == [], f"{record}'s notes add numbers its script did not print"
