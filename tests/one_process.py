"""`python -m tests.one_process < CALLS.json`: several `python -m MODULE ARGS` commands run one after
another in this one interpreter, each as `python -m` runs it (runpy as __main__, its own argv, its
stdout, stderr and exit status captured), so a batch of commands that stop early (usage, bad input)
pays the imports once. Reads [[module, [args...]], ...]; writes [{returncode, stdout, stderr}, ...]
as JSON to the real stdout."""

import io
import json
import runpy
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout


def exit_status(stop: SystemExit, stderr) -> int:
    """The status `python -m` would exit with: an int as is, None as 0, anything else printed and 1."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=stderr)
    return 1


def run_one(module: str, args: list[str]) -> dict:
    from hydra.core.global_hydra import GlobalHydra

    stdout, stderr = io.StringIO(), io.StringIO()
    sys.argv = [module, *args]
    with redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as stop:
            status = exit_status(stop, stderr)
        except BaseException:  # an uncaught error: the traceback and status 1, as the interpreter would
            traceback.print_exc()
            status = 1
        finally:
            GlobalHydra.instance().clear()  # the next command composes afresh
    return {"returncode": status, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def main() -> None:
    calls = json.load(sys.stdin)
    real_stdout = sys.stdout
    results = [run_one(module, list(args)) for module, args in calls]
    real_stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
