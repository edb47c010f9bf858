"""Benchmark records hold what their scripts printed (issue 49): a record rewritten by its script
since carries the command that wrote it, and its hand-written notes interpret, adding no number.
RECORDS_BY_SCRIPT lists the records regenerated so far; the others still carry typed-in notes."""

import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
RECORDS_BY_SCRIPT = {"pairing.md": "pairing.py", "pairing_zen5.md": "pairing.py", "default_study.md": "study_record.py"}


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


@pytest.mark.parametrize("record", sorted(RECORDS_BY_SCRIPT))
def test_a_record_written_by_its_script_adds_no_number_by_hand(record):
    text = (BENCHMARKS / record).read_text()
    script = RECORDS_BY_SCRIPT[record]
    assert (BENCHMARKS / script).is_file(), script
    assert script in text, f"{record} does not name {script}, the script whose output it is"
    assert typed_numbers(notes_of(text)) == [], f"{record}'s notes add numbers its script did not print"
