"""`python -m tests.command_server`: one interpreter that runs the project's `python -m MODULE ARGS`
commands one after another, each as `python -m` runs it (runpy as __main__, its own argv, exit
status, and file descriptors 1 and 2 pointed at files of the caller's), so a test process pays
torch's, transformers' and Hydra's imports once instead of once per command (~3 s of the 4.2 s
`python -m specexp --help` takes on a 2-core Zen 5).

Protocol: one JSON request per line on stdin, {"module", "args", "stdout", "stderr"} (the two
file paths the command's output goes to); one JSON line back, {"returncode"}, on the file
descriptor given as argv[1]. What a command leaves behind for the next is reset between them:
Hydra's global state, sys.argv and the standard streams, the working directory. The process
caches specexp keeps by design (a sweep's jobs share one process too) stay."""

import gc
import json
import os
import runpy
import sys
import traceback


def exit_status(stop: SystemExit) -> int:
    """The status `python -m` would exit with: an int as is, None as 0, anything else printed and 1."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def run_as_main(module: str, args: list[str]) -> int:
    """``module`` run as `python -m module args` runs it, in this interpreter: its exit status."""
    from hydra.core.global_hydra import GlobalHydra

    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as stop:
        return exit_status(stop)
    except BaseException:  # an uncaught error: the traceback and status 1, as the interpreter would
        traceback.print_exc()
        return 1
    finally:
        GlobalHydra.instance().clear()  # the next command composes afresh


def point_output_at(stdout_fd: int, stderr_fd: int) -> None:
    """File descriptors 1 and 2 (what C code and child processes write to as well) onto these."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)


def serve(reply_fd: int) -> None:
    cwd, streams = os.getcwd(), (sys.stdout, sys.stderr)
    devnull = os.open(os.devnull, os.O_WRONLY)
    requests = os.fdopen(os.dup(0))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # a command that reads its stdin reads nothing, not the requests
    sys.stdin = open(os.devnull)
    with requests, os.fdopen(reply_fd, "w") as reply:
        for line in requests:
            request = json.loads(line)
            out, err = (os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for name in ("stdout", "stderr"))
            point_output_at(out, err)
            try:
                status = run_as_main(request["module"], request["args"])
            finally:
                sys.stdout, sys.stderr = streams
                point_output_at(devnull, devnull)
                os.close(out)
                os.close(err)
                os.chdir(cwd)
                gc.collect()
            reply.write(json.dumps({"returncode": status}) + "\n")
            reply.flush()


def import_and_freeze() -> None:
    """The libraries every command imports, imported before the first, and their objects moved out of
    the collector's reach (gc.freeze: module-level objects live as long as the process anyway). A
    full collection here then scans what commands made, not ~400k objects of torch, transformers and
    Hydra each time: it was 0.28 s a collection, 70 a server in a test run."""
    import hydra  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    import specexp.cli  # noqa: F401
    import specexp.study.run  # noqa: F401

    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    import_and_freeze()
    serve(int(sys.argv[1]))
