"""Speculative decoding at real model shapes on the device at hand: realized against analytic speedup.

Random-weight Llamas are built on the device from their configs (no weights travel): a Llama-3.1-8B-
shaped target with a Llama-3.2-1B-shaped draft in bf16 on a GPU (``--shapes gpu``), a Llama-3.2-1B-
shaped target with a SmolLM2-135M-shaped draft in fp32 on a CPU (``--shapes cpu``), or toy shapes in
seconds (``--shapes toy``, what the test suite runs). The target's final norm keeps one hidden
direction (the others scaled by 1e-3), so its argmax has a wide margin and greedy decoding has no
near-ties between graph shapes: the greedy continuation is then a few alternating tokens, which no
cost depends on. The draft is the oracle (`draft=oracle`): it proposes the target's own greedy
continuation, each token kept with probability alpha (on the device, no per-token host work), while
running the draft model's steps for their real cost; so alpha is set and c and the verify cost are
measured, and the analytic speedup (1 - a^(K+1)) / ((1 - a)(K c + v)) can be compared with the
speedup realized over compiled AR (its 95% interval from A B B A timings of every prompt).

It prints, and writes to ``--out`` as each result completes: the memory-bandwidth floor of the
target's decode (its weights' bytes over the bandwidth of a reduction over 1 GiB), AR ms/token
eager and compiled, the draft's step cost c = T_draft(1) / T(1), the verify pass's cost
v = T(K+1) / T(1), and per K and alpha the realized speedup with its interval, the analytic one and
their ratio, the measured alpha and tau, the verify tail's ms per round, and whether the greedy
output equals compiled AR's.

    python benchmarks/gpu_pairs.py --shapes gpu    # one GPU, about 7 minutes with CUDA graphs
    python benchmarks/gpu_pairs.py --shapes cpu    # this CPU, the largest shapes that fit
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from common import machine, report_header, write_report
from transformers import LlamaConfig, LlamaForCausalLM

from specexp.core import metrics
from specexp.core.engine import GenerationOutput, generate
from specexp.core.sampling import SamplingConfig
from specexp.costs.hardware_profile import measure_target
from specexp.drafts.oracle import OracleDrafter
from specexp.models import LoadedModel
from specexp.runtime import round_rows
from specexp.runtime.compiled import full_pass
from specexp.runtime.decoder import lean_decoder
from specexp.runtime.lean import LeanRuntime
from specexp.study import intervals

GREEDY = SamplingConfig()
LLAMA_3_1_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
LLAMA_3_2_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                    intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True)
SMOLLM2_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, vocab_size=128256, tie_word_embeddings=True)  # on the target's vocabulary
TOY_TARGET = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=256, vocab_size=512, tie_word_embeddings=False)
TOY_DRAFT = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=128, vocab_size=512, tie_word_embeddings=True)
# --shapes NAME: (target, draft, their names, dtype, device)
SHAPES = {
    "gpu": (LLAMA_3_1_8B, LLAMA_3_2_1B, ("Llama-3.1-8B", "Llama-3.2-1B"), torch.bfloat16, "cuda"),
    "cpu": (LLAMA_3_2_1B, SMOLLM2_135M, ("Llama-3.2-1B", "SmolLM2-135M"), torch.float32, "cpu"),
    "toy": (TOY_TARGET, TOY_DRAFT, ("toy-4L", "toy-1L"), torch.float32, "cpu"),
}


def random_llama(shape: dict, name: str, dtype: torch.dtype, device: str, seed: int, sharp: bool) -> LoadedModel:
    """A Llama of ``shape`` with random weights, built on ``device``; ``sharp``: the final norm keeps one
    hidden direction, so the argmax has a wide margin."""
    torch.manual_seed(seed)
    config = LlamaConfig(**shape, max_position_embeddings=8192, rms_norm_eps=1e-5, eos_token_id=None, bos_token_id=None)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype).eval()
    if sharp:
        with torch.no_grad():
            model.model.norm.weight.fill_(1e-3)
            model.model.norm.weight[0] = 1.0
    return LoadedModel(model=model, tokenizer=None, name=f"random-{name}")


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.inference_mode()
def bandwidth(device: str, n_bytes: int = 1 << 30, repeats: int = 9) -> float:
    """Bytes per second of a sum over ``n_bytes`` of float32 (each byte read once), median of ``repeats``."""
    x = torch.ones(n_bytes // 4, device=device)
    times = []
    for _ in range(repeats + 1):
        sync(device)
        start = time.perf_counter()
        x.sum()
        sync(device)
        times.append(time.perf_counter() - start)
    return n_bytes / statistics.median(times[1:])


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def decode(forward, target: LoadedModel, prompt: list[int], drafter, max_new: int, settle=None) -> GenerationOutput:
    """A greedy decode; ``settle``: the round's verify and commit compiled (runtime.compile=true)."""
    return generate(forward, [prompt], drafter, GREEDY, max_new, [],
                    torch.Generator(target.model.device).manual_seed(0), compiled_settle=settle)


def decode_ms_per_token(out: GenerationOutput) -> float:
    """Milliseconds per new token after the prompt pass (which gives the first)."""
    return 1e3 * (out.total_s - out.prefill_s) / max(len(out.tokens[0]) - 1, 1)


def analytic_speedup(alpha: float, k: int, c: float, v: float) -> float:
    """(1 - a^(K+1)) / ((1 - a)(K c + v)): expected tokens per round over the round's cost in target steps."""
    return metrics.expected_tokens_per_round(alpha, k) / (k * c + v)


def timed_pair(forward, target: LoadedModel, prompts: list[list[int]], drafter, max_new: int, repeats: int,
               settle) -> tuple[dict, list[GenerationOutput]]:
    """Compiled AR and the speculative decode of every prompt, A B B A (the leading arm alternating by
    prompt and pass): the speedup and its interval (study/intervals.py), and the speculative outputs."""
    records, spec_outs = [], []
    for arm in (None, drafter):
        decode(forward, target, prompts[0], arm, 4, settle)  # first calls of a configuration: untimed
    for rep in range(repeats):
        for p, prompt in enumerate(prompts):
            order = [drafter, None] if (p + rep) % 2 else [None, drafter]
            for j, arm in enumerate(order + order[::-1]):
                out = decode(forward, target, prompt, arm, max_new, settle)
                records.append({"mode": "ar" if arm is None else "spec", "batch": p, "repeat": 2 * rep + j // 2,
                                "tokens": len(out.tokens[0]), "total_s": out.total_s})
                if arm is not None:
                    spec_outs.append(out)
    paired = intervals.paired_timings(pd.DataFrame(records))
    return {"speedup": intervals.paired_speedup(paired)} | intervals.speedup_interval(paired), spec_outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=list(SHAPES), default="gpu")
    parser.add_argument("--alphas", type=lambda s: [float(a) for a in s.split(",")], default=[0.6, 0.8, 0.9])
    parser.add_argument("--ks", type=lambda s: [int(k) for k in s.split(",")], default=[2, 4, 6])
    parser.add_argument("--prompts", type=int, default=3, help="random prompts, each timed A B B A per pass")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="timing passes over the prompts")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (eager: the capture alone)")
    parser.add_argument("--out", type=Path, default=None, help="the record (default: benchmarks/gpu_pairs_SHAPES.md)")
    args = parser.parse_args()
    target_shape, draft_shape, names, dtype, device = SHAPES[args.shapes]
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --shapes gpu needs a CUDA device; this torch sees none (use --shapes cpu or toy)")
    out_path = args.out or Path(__file__).with_name(f"gpu_pairs_{args.shapes}.md")
    results_path = out_path.with_suffix(".jsonl")
    results_path.write_text("")
    started = time.perf_counter()

    def record(**fields) -> dict:  # each result as it completes
        fields["elapsed_s"] = round(time.perf_counter() - started, 1)
        with results_path.open("a") as f:
            f.write(json.dumps(fields) + "\n")
        print(json.dumps(fields), flush=True)
        return fields

    target = random_llama(target_shape, names[0], dtype, device, seed=0, sharp=True)
    draft = random_llama(draft_shape, names[1], dtype, device, seed=1, sharp=False)
    generator = torch.Generator().manual_seed(2)
    prompts = torch.randint(target_shape["vocab_size"], (args.prompts, args.prompt_tokens),
                            generator=generator).tolist()
    k_max = max(args.ks)
    built = record(stage="built", target_gb=weight_bytes(target.model) / 1e9, draft_gb=weight_bytes(draft.model) / 1e9)

    # The floor and AR, eager and compiled (the target's and the draft's steps through one compiler).
    floor_ms = 1e3 * weight_bytes(target.model) / bandwidth(device)
    probe = OracleDrafter(target, alpha=1.0, k=k_max, cost=draft)  # plans and compiles the draft's steps
    plan = device == "cpu"  # the study's matmul plan: a layout per shape where this CPU measured it faster
    eager = LeanRuntime(matmul_plan=plan).prepare(target, probe, round_rows(1, k_max)).forward
    eager_ms = statistics.median(decode_ms_per_token(decode(eager, target, p, None, args.max_new_tokens))
                                 for p in prompts)
    runtime = LeanRuntime(compile=True, compile_backend=args.backend, matmul_plan=plan)
    compiled = runtime.prepare(target, probe, round_rows(1, k_max)).forward
    draft_compiled = runtime.compiler.decoder(lean_decoder(draft.model), "draft")  # the oracle's draft steps run here
    capacity = args.prompt_tokens + 2 * (args.max_new_tokens + k_max + 1)
    for model, decoder in ((target, compiled), (draft, draft_compiled)):  # every graph before anything is timed
        decoder.warm([1], range(1, k_max + 2), capacity, [full_pass(model.model.config.num_hidden_layers)])
    settle = runtime.compiler.settle  # a round's verify and commit, compiled
    runtime.compiler.warm_settle([1], range(k_max + 1), target_shape["vocab_size"],
                                 torch.zeros(0, dtype=torch.long, device=device))
    references = [decode(compiled, target, p, None, args.max_new_tokens + k_max, settle).tokens[0] for p in prompts]
    compiled_ms = statistics.median(decode_ms_per_token(decode(compiled, target, p, None, args.max_new_tokens, settle))
                                    for p in prompts)
    context = [args.prompt_tokens + args.max_new_tokens // 2]
    passes = measure_target(compiled, 1, k_max + 1, context, GREEDY, repeats=7)[0][0]  # T(n), n = 1..K+1
    draft_step = measure_target(draft_compiled, 1, 1, context, GREEDY, repeats=7)[0][0][0]
    c = draft_step / passes[0]
    costs = record(stage="costs", floor_ms=floor_ms, ar_eager_ms=eager_ms, ar_compiled_ms=compiled_ms,
                   compiled_over_floor=compiled_ms / floor_ms, target_pass_ms=[1e3 * t for t in passes],
                   draft_step_ms=1e3 * draft_step, c=c)

    rows = []
    for k in args.ks:
        v = passes[k] / passes[0]
        for alpha in args.alphas:
            drafter = OracleDrafter(target, alpha=alpha, k=k, cost=draft, seed=int(100 * alpha) + k)
            drafter.compile_steps(runtime.compiler)
            drafter.set_reference(prompts, references)
            speedup, outs = timed_pair(compiled, target, prompts, drafter, args.max_new_tokens, args.repeats, settle)
            proposed, accepted = (np.concatenate([getattr(o, name).flatten().numpy() for o in outs])
                                  for name in ("n_proposed", "n_accepted"))
            rounds = sum(len(o.k_chosen) for o in outs)
            analytic = analytic_speedup(alpha, k, c, v)
            rows.append(record(stage="pair", k=k, alpha=alpha, v=v, speedup=speedup["speedup"],
                               speedup_ci95=speedup.get("speedup_ci95"), analytic=analytic,
                               realized_over_analytic=speedup["speedup"] / analytic,
                               alpha_measured=metrics.alpha(proposed, accepted),
                               tau=sum(len(o.tokens[0]) - 1 for o in outs) / max(rounds, 1),
                               verify_ms=1e3 * float(np.median(np.concatenate([o.verify_s for o in outs]))),
                               identical=all(o.tokens[0] == references[i // 2 % len(prompts)][: args.max_new_tokens]
                                             for i, o in enumerate(outs))))  # each prompt's twice a pass
    passes_run = runtime.compiler.stats()

    lines = report_header(f"Speculative decoding at {names[0]} / {names[1]} shapes ({args.shapes})")
    lines += [f"Device: {torch.cuda.get_device_name() if device == 'cuda' else machine()}; {str(dtype)[6:]}, "
              f"compiled ({runtime.compiler.mode}, {args.backend}); {args.prompts} random prompts of "
              f"{args.prompt_tokens} tokens, {args.max_new_tokens} new tokens, {args.repeats} timing pass(es), "
              f"greedy; weights {built['target_gb']:.2f} GB (target), {built['draft_gb']:.2f} GB (draft).", ""]
    lines += ["| measure | value |", "|---|---|",
              f"| memory-bandwidth floor of the target's decode | {floor_ms:.2f} ms/token |",
              f"| AR eager | {eager_ms:.2f} ms/token |",
              f"| AR compiled | {compiled_ms:.2f} ms/token ({costs['compiled_over_floor']:.2f}x the floor) |",
              f"| target pass T(n), n = 1..{k_max + 1} | {', '.join(f'{1e3 * t:.2f}' for t in passes)} ms |",
              f"| draft step | {1e3 * draft_step:.2f} ms (c = {c:.3f}) |",
              f"| compiled calls | {passes_run['compiled_passes']}, "
              f"cudagraph skips {passes_run['cudagraph_skips']} |", ""]
    lines += ["| K | alpha | alpha measured | tau | v = T(K+1)/T(1) | speedup over compiled AR [95%] | analytic | "
              "realized / analytic | verify tail ms/round | greedy = AR |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['k']} | {row['alpha']:.1f} | {row['alpha_measured']:.3f} | {row['tau']:.2f} | "
                     f"{row['v']:.2f} | {intervals.fmt_interval(row['speedup'], row['speedup_ci95'])} | "
                     f"{row['analytic']:.3f} | {row['realized_over_analytic']:.3f} | {row['verify_ms']:.3f} | "
                     f"{row['identical']} |")
    lines += ["", f"Elapsed: {time.perf_counter() - started:.0f} s; every result also in `{results_path.name}`."]
    write_report(out_path, lines)


if __name__ == "__main__":
    main()
