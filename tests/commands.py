"""The project's commands as a user runs them: `python -m MODULE ARGS` from the repository root,
output captured, W&B offline (no run a test starts reaches a server).

Each test process runs its commands in one interpreter of its own (tests/command_server.py), which
imports torch, transformers and Hydra once; a command given another environment, or asked for
with ``fresh=True``, gets a new interpreter, as a user's shell would start."""

import atexit
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OFFLINE_WANDB = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
# What pytest and libraries set in a test process's environment as their own state, not a user's setting, so
# not part of a command's: the test's name (pytest), the seed of seed_everything and the CUDA check importing
# Lightning sets, the address of a function compiled kernels call (inductor), the port of the service a run
# started (W&B). Counted in, each would send every later command of that worker to a new interpreter.
PROCESS_STATE = ("PYTEST_CURRENT_TEST", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "PYTORCH_NVML_BASED_CUDA_CHECK",
                 "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "WANDB_SERVICE")


def default_env() -> dict[str, str]:
    return {k: v for k, v in {**os.environ, **OFFLINE_WANDB}.items() if k not in PROCESS_STATE}


class CommandServer:
    """A `python -m tests.command_server` child: commands in, exit statuses out, output in files."""

    def __init__(self) -> None:
        self.env = default_env()
        reply_read, reply_write = os.pipe()
        self.process = subprocess.Popen([sys.executable, "-m", "tests.command_server", str(reply_write)], cwd=REPO,
                                        env=self.env, stdin=subprocess.PIPE, text=True, pass_fds=(reply_write,),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(reply_write)
        self.replies = os.fdopen(reply_read)

    def run(self, module: str, args: list[str], timeout: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", module, *args]
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            self.process.stdin.write(json.dumps({"module": module, "args": args, "stdout": str(out),
                                                 "stderr": str(err)}) + "\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.replies], [], [], timeout)
            line = self.replies.readline() if ready else ""
            if not line:  # past its time, or the interpreter died under it (a crash, a signal)
                self.stop()
                command_server.cache_clear()
                if not ready:
                    raise subprocess.TimeoutExpired(cmd, timeout, read(out), read(err))
                return subprocess.CompletedProcess(cmd, self.process.returncode, read(out), read(err))
            return subprocess.CompletedProcess(cmd, json.loads(line)["returncode"], read(out), read(err))

    def stop(self) -> None:
        """The server and whatever its commands left running (its own process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@functools.cache
def command_server() -> CommandServer:
    server = CommandServer()
    atexit.register(server.stop)
    return server


def run_module(module: str, *args: str, timeout: int = 600, env: dict | None = None,
               fresh: bool = False) -> subprocess.CompletedProcess:
    """``env``: the command's whole environment (default: this process's, W&B offline).
    ``fresh``: in a new interpreter even where the shared one would do."""
    if env is None:
        env = default_env()
        if not fresh and (changed := changed_since_start(env)):
            warnings.warn(f"`python -m {module}` runs in a new interpreter (~6 s of imports): this process's "
                          f"environment changed since its command server started ({', '.join(changed)})", stacklevel=2)
    if fresh or env != command_server().env:
        return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, env=env)
    return command_server().run(module, list(args), timeout)


def changed_since_start(env: dict[str, str]) -> list[str]:
    """The variables in which ``env`` differs from the command server's."""
    started = command_server().env
    return sorted(k for k in env.keys() | started.keys() if env.get(k) != started.get(k))


def run_specexp(*overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m specexp OVERRIDES`: a study (or, with -m, a sweep)."""
    return run_module("specexp", *overrides, timeout=timeout)


def run_distill(*args: str) -> subprocess.CompletedProcess:
    """`python -m specexp.distill ARGS`."""
    return run_module("specexp.distill", *args)


def on_tiny_local_target(conf: Path) -> list[str]:
    """The overrides that run a command on conftest's tiny local target (``conf``: the tiny_local_conf fixture)."""
    return [f"hydra.searchpath=[file://{conf}]", "target=tiny_local"]


SMOKE_STUDY = ["size=smoke", "data.limit=1", "max_new_tokens=8"]  # a one-prompt, 8-token study


def run_smoke_study(*args: str) -> subprocess.CompletedProcess:
    """A one-prompt, 8-token study."""
    return run_specexp(*SMOKE_STUDY, *args)


def run_each(calls: dict[str, tuple[str, list[str]]], timeout: int = 600) -> dict[str, subprocess.CompletedProcess]:
    """``calls``: name -> (MODULE, ARGS); each `python -m MODULE ARGS` run one after another."""
    return {name: run_module(module, *args, timeout=timeout) for name, (module, args) in calls.items()}


def run_each_study(folder: Path, args: dict[str, list[str]]) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """``args``: name -> ARGS; each `python -m specexp ARGS` into a run folder of its own under ``folder``,
    one after another: name -> (its run folder, CompletedProcess)."""
    runs = {name: folder / str(i) for i, name in enumerate(args)}
    calls = {name: ("specexp", [*args[name], f"hydra.run.dir={run}"]) for name, run in runs.items()}
    return {name: (runs[name], out) for name, out in run_each(calls).items()}
