"""The model runtime on the default target, in one process (issue 18, item 9).

  python benchmarks/runtime.py [--prompts 8] [--max-new-tokens 64] [--max-n 17] [--repeats 9]
                               [--gguf SmolLM2-135M-Instruct-F32.gguf]

Copies of the embedded SmolLM2-135M-Instruct (fp32), each set up as a study sets up its target:
- before: transformers' forward with F.linear (`runtime=hf runtime.matmul_plan=false`), what every
  study ran before the runtime work;
- hf: `runtime=hf`, transformers' forward with this machine's matmul plan;
- lean: `runtime=lean` (the default), the lean decoder with fused projections over the static
  ragged cache, with the plan;
- lean compiled: `runtime=lean runtime.compile=true runtime.compile_max_tokens=4` (passes of more
  tokens run eagerly: each further bucket is another compile of ~100 s here).

Measured side by side, the copies taking turns:
- the stream bandwidth (a sum over a tensor the size of the weights) and the floor it implies
  for one decoding step (weight bytes / bandwidth);
- T(n)/T(1) for n = 1..max_n: one target pass over n new tokens after a 64-token prompt (the
  verify pass of a round with K = n - 1), median of repeats;
- AR decoding through our engine on each copy, HF `generate` (F.linear), and llama.cpp when
  llama-cpp-python is installed and `--gguf` names an F32 GGUF of the same model: ms/token;
- the default study (MT-bench, greedy, batch 1) for every shipped draft config against AR,
  before and on runtime=lean: alpha, verify cost, c, speedup.
"""

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch
from common import decode_hf, decode_ours, interleaved_summaries, machine, stream_bandwidth, study_draft

from specexp.core.kv import new_ragged_kv
from specexp.core.sampling import SamplingConfig
from specexp.data import encode_prompts, mt_bench
from specexp.models.embedded import load_embedded_target
from specexp.paths import CONFIG_DIR
from specexp.reporting.report import fmt
from specexp.runtime import HFRuntime, round_rows
from specexp.runtime.lean import LeanRuntime

NEEDS_A_MODEL = {"small_lm"}  # draft configs that need a user's draft.model


def runtimes() -> dict:
    return {"before": HFRuntime(matmul_plan=False), "hf": HFRuntime(), "lean": LeanRuntime(),
            # Compiled passes of up to 4 tokens (buckets 1, 2, 4: three graphs, ~100 s each on a 2-core CPU)
            "lean compiled": LeanRuntime(compile=True, compile_max_tokens=4)}


@torch.inference_mode()
def pass_times(forwards: dict, max_n: int, repeats: int) -> dict[str, list[float]]:
    """Median seconds of one pass over n = 1..max_n new tokens after a 64-token prompt, per forward,
    the forwards and token counts taking turns."""
    prompt = torch.arange(100, 164)[None]
    caches = {}
    for name, forward in forwards.items():
        caches[name] = new_ragged_kv(forward, 1, prompt.device, capacity=64 + max_n)
        caches[name].forward(forward, prompt, torch.ones_like(prompt))
    times = {name: {n: [] for n in range(1, max_n + 1)} for name in forwards}
    for _ in range(repeats + 1):  # the first round warms up (a compiled forward compiles there)
        for n in range(1, max_n + 1):
            x = torch.arange(200, 200 + n)[None]
            for name, forward in forwards.items():
                start = time.perf_counter()
                caches[name].forward(forward, x, logits_to_keep=n)
                times[name][n].append(time.perf_counter() - start)
                caches[name].drop_last(torch.tensor([n]))
    return {name: [statistics.median(times[name][n][1:]) for n in range(1, max_n + 1)] for name in forwards}


def llama_cpp_ms_per_token(gguf: Path | None, encoded: list[list[int]], max_new: int) -> float | None:
    """llama.cpp's greedy decoding of the same prompt ids, ms/token (None without it or a GGUF)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    if gguf is None:
        return None
    llm = Llama(model_path=str(gguf), n_threads=torch.get_num_threads(), n_ctx=2048, verbose=False)
    per_token = []
    for ids in encoded:
        llm.reset()
        start, n = time.perf_counter(), 0
        for _token in llm.generate(ids, temp=0.0, top_k=1):
            n += 1
            if n == max_new:
                break
        per_token.append((time.perf_counter() - start) / n)
    return statistics.median(per_token) * 1e3


def shipped_drafts(target, forward, record: dict, names: list[str], prompt: list[int]) -> dict:
    """name -> (drafter, K, K policy) for each draft config as `python -m specexp draft=NAME` builds it
    (draft.k=auto: K chosen per round from this machine's profile)."""
    drafts = {}
    for name in names:
        drafter, k, policy, _, _ = study_draft(target, forward, record, name, prompt)
        drafts[f"{name} K={'auto' if policy else k}"] = (drafter, k, policy)
    return drafts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-n", type=int, default=17)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--gguf", type=Path, help="an F32 GGUF of the target, for llama.cpp (optional)")
    parser.add_argument("--no-compile", action="store_true", help="leave out runtime.compile=true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("runtime.md"))
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    setups = runtimes()
    if args.no_compile:
        del setups["lean compiled"]
    targets = {name: load_embedded_target("float32", "cpu") for name in setups}
    prepared = {name: rt.prepare(targets[name], None, round_rows(1, args.max_n - 1)) for name, rt in setups.items()}
    forwards = {name: p.forward for name, p in prepared.items()}
    reference = targets["before"]
    weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in reference.model.parameters()}.values())
    bandwidth = stream_bandwidth(weight_bytes)
    floor_ms = weight_bytes / bandwidth * 1e3
    lines = [f"# The model runtime on the default target ({datetime.date.today()})", "",
             f"Machine: {machine()}. Command: `python benchmarks/runtime.py --prompts {args.prompts} "
             f"--max-new-tokens {args.max_new_tokens} --max-n {args.max_n} --repeats {args.repeats}`.", "",
             f"Stream bandwidth {bandwidth / 1e9:.1f} GB/s; the target's {weight_bytes / 1e6:.0f} MB of fp32 weights "
             f"put one decoding step's floor at {floor_ms:.1f} ms.", "",
             "Runtimes: " + "; ".join(f"**{name}**: {p.record['name']}, "
                                      + ", ".join(f"{k}={p.record[k]}" for k in ("matmul_plan", "fuse_projections",
                                                                                  "compile") if k in p.record)
                                      for name, p in prepared.items()), ""]

    times = pass_times(forwards, args.max_n, args.repeats)
    lines += ["## T(n): one target pass over n new tokens (64-token context)", "",
              "| n | " + " | ".join(f"{name} ms | T(n)/T(1)" for name in forwards) + " |",
              "|---|" + "---|---|" * len(forwards)]
    for n in range(1, args.max_n + 1):
        lines.append(f"| {n} | " + " | ".join(f"{times[name][n - 1] * 1e3:.1f} | "
                                              f"{times[name][n - 1] / times[name][0]:.2f}" for name in forwards) + " |")

    prompts = mt_bench(limit=args.prompts, seed=0)
    encoded = encode_prompts(reference.tokenizer, prompts)
    for name in forwards:  # warm-up outside the timed decodes (a compiled forward compiles its shapes here)
        decode_ours(targets[name], encoded[0], None, 4, forwards[name])
    per_token = {f"ours, {name}": [] for name in forwards} | {"HF generate, F.linear": []}
    identical = {name: 0 for name in forwards}
    for ids in encoded:  # in turns, per prompt
        tokens_hf, seconds = decode_hf(reference, ids, args.max_new_tokens)
        per_token["HF generate, F.linear"].append(seconds / len(tokens_hf))
        for name, forward in forwards.items():
            out = decode_ours(targets[name], ids, None, args.max_new_tokens, forward)
            per_token[f"ours, {name}"].append(out.total_s / len(out.tokens[0]))
            identical[name] += out.tokens[0] == tokens_hf
    llama_ms = llama_cpp_ms_per_token(args.gguf, encoded, args.max_new_tokens)
    hf_ms = statistics.median(per_token["HF generate, F.linear"]) * 1e3
    lines += ["", f"## AR decoding, MT-bench ({args.prompts} prompts x {args.max_new_tokens} tokens, prefill included)",
              "", "| decoder | ms/token (median over prompts) | x floor | tokens/s vs HF generate | "
              "answers identical to HF generate |", "|---|---|---|---|---|"]
    for name, values in per_token.items():
        ms = statistics.median(values) * 1e3
        same = f"{identical[name.removeprefix('ours, ')]}/{len(encoded)}" if name.startswith("ours") else "-"
        lines.append(f"| {name} | {ms:.1f} | {ms / floor_ms:.2f} | {hf_ms / ms:.2f} | {same} |")
    lines.append(f"| llama.cpp F32 | {llama_ms:.1f} | {llama_ms / floor_ms:.2f} | {hf_ms / llama_ms:.2f} | - |"
                 if llama_ms else "| llama.cpp F32 | not measured (llama-cpp-python or --gguf absent) | | | |")
    lines.append(f"| floor (weights / stream bandwidth) | {floor_ms:.1f} | 1.00 | {hf_ms / floor_ms:.2f} | - |")

    names = sorted(p.stem for p in (Path(CONFIG_DIR) / "draft").glob("*.yaml")
                   if p.stem not in NEEDS_A_MODEL | {"oracle"})
    args.out.write_text("\n".join(lines) + "\n")  # what is measured so far survives a crash below
    lines += ["", f"## The default study's drafts, before and on runtime=lean (MT-bench, greedy, batch 1; "
              f"{', '.join(sorted(NEEDS_A_MODEL))} needs a user's draft.model)", "",
              "| runtime | draft | alpha | verify cost | c | speedup over AR | identical to AR |",
              "|---|---|---|---|---|---|---|"]
    for name in ("before", "lean"):
        target = targets[name]
        methods = {"ar": (None, 0), **shipped_drafts(target, forwards[name], prepared[name].record, names, encoded[0])}
        for drafter, k, _ in list(methods.values())[1:]:  # as a study does: the draft's own models follow the runtime
            setups[name].prepare(target, drafter, round_rows(1, k))
        results = interleaved_summaries(target, prompts, encoded, methods, SamplingConfig(), args.max_new_tokens, 0,
                                        desc=name, forward=forwards[name])
        for draft, s in results.items():
            # alpha and c are None for a draft k=auto never asked (no K pays on this machine)
            lines.append(f"| {name} | {draft} | {fmt(s['alpha'])} | {s['verify_cost_ratio']:.2f} | "
                         f"{fmt(s['cost_ratio_c'])} | {s['speedup']:.3f} | {s['identical']}/{len(prompts)} |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
