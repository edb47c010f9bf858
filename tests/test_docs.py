"""What the README and docs/ name exists, so they cannot drift from the code: every `python -m` command
is a module, every command line of a configured command composes (its groups' options, its experiments,
its keys), and every repository path (a file or folder, in backticks or a link) is there. docs/lab_notes/
are dated records of what was measured then, and are not held to today's tree."""

import re
import shlex
from pathlib import Path

import pytest

from specexp.configs import check_command_line
from specexp.errors import UserInputError
from tests.commands import REPO

PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
CONFIGURED = {"specexp": "config", "specexp.distill": "distill"}  # commands whose arguments are Hydra overrides
TOP_LEVEL = ("specexp/", "conf/", "experiments/", "tests/", "benchmarks/", "analysis/", "docs/", ".ci/")
PACKAGE_FOLDERS = tuple(f"{p.name}/" for p in (REPO / "specexp").iterdir() if p.is_dir() and p.name != "__pycache__")
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\*|\.\.\.|\{|<")  # NAME, FILE, DIR, a glob, an elision: a pattern, not a path


def page_text(page: Path) -> str:
    return page.read_text()


def command_lines(text: str) -> list[list[str]]:
    """Each `python -m specexp...` invocation, in code blocks (continued lines joined) and inline code."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = re.findall(r"python -m (specexp[\w.]*)([^`\n|;&)]*)", text)
    return [[module, *words] for module, rest in found for words in [split_words(rest)]]


def split_words(rest: str) -> list[str]:
    rest = rest.split("#")[0].split(" then ")[0]
    try:
        return shlex.split(rest)
    except ValueError:
        return rest.split()


def named_paths(text: str) -> set[str]:
    """Repository paths in backticks or links: top-level folders' files, and package-relative ones."""
    candidates = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)\s#]+)", text)
    paths = set()
    for token in candidates:
        token = token.split(":")[0].rstrip(".,")
        if token.startswith(("http", "~", "$", "/")) or PLACEHOLDER.search(token) or "=" in token:
            continue
        if token.startswith(TOP_LEVEL + PACKAGE_FOLDERS) and (token.endswith("/") or "." in token.rsplit("/", 1)[-1]):
            paths.add(token)
        elif re.fullmatch(r"\w+\.(py|sh|yaml)", token):  # a bare file name: it must be somewhere in the tree
            paths.add(token)
    return paths


EXTENSIONS = {"py", "md", "yaml", "sh", "json", "jsonl", "parquet", "csv", "toml", "txt", "ipynb", "safetensors",
              "jinja", "pdf", "png", "tex", "cfg", "whl", "log", "ckpt", "gguf", "arrow", "lock"}


def exists(page: Path, path: str) -> bool:
    """A file or folder under the repository, the package or the page's folder; `module.name`: a module that
    defines that name (def, class or assignment)."""
    roots = (REPO, REPO / "specexp", page.parent)
    stem, _, suffix = path.rpartition(".")
    if "/" not in suffix and suffix not in EXTENSIONS and stem:
        name = suffix
        files = [root / f"{stem}.py" for root in roots if (root / f"{stem}.py").is_file()]
        defined = re.compile(rf"^\s*(def|class) {name}\b|^\s*{name}\s*[:=]", re.M)
        return any(defined.search(f.read_text()) for f in files)
    if "/" not in path:
        return any(REPO.glob(f"*/**/{path}"))
    return any((root / path).exists() for root in roots)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    missing = sorted(p for p in named_paths(page_text(page)) if not exists(page, p))
    assert not missing, f"{page.name} names paths that are not in the repository: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_a_page_names_is_a_module(page):
    import importlib.util

    modules = {line[0] for line in command_lines(page_text(page))}
    assert not [m for m in modules if importlib.util.find_spec(m) is None], modules


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_configured_command_line_a_page_gives_composes(page):
    """Its groups' options exist, its experiments are that command's, its keys are in the config."""
    failures = []
    for module, *args in command_lines(page_text(page)):
        if module not in CONFIGURED or any(re.search(r"[A-Z*<{~]|\.\.\.|^--config-dir|searchpath", a) for a in args):
            continue  # a pattern (draft=NAME, student=S, a hub name) or a user's own config folder
        try:
            check_command_line(CONFIGURED[module], args)
        except UserInputError as error:
            failures.append(f"python -m {module} {' '.join(args)}: {error}")
    assert not failures, "\n".join(failures)


def test_the_checks_find_what_drifted(tmp_path):
    """A page naming a file, a group option and a key that do not exist fails each check."""
    page = tmp_path / "page.md"
    page.write_text("See `specexp/core/nowhere.py`.\n\n```bash\npython -m specexp draft=nosuch\n"
                    "python -m specexp draft.kk=3\n```\n")
    assert named_paths(page_text(page)) == {"specexp/core/nowhere.py"}
    assert not exists(page, "specexp/core/nowhere.py") and exists(page, "core/verify.py")
    lines = command_lines(page_text(page))
    assert lines == [["specexp", "draft=nosuch"], ["specexp", "draft.kk=3"]]
    for _, *args in lines:
        with pytest.raises(UserInputError):
            check_command_line("config", args)
