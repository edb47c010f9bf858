"""The verify tail of a round, timed on the device at hand: from the target's logits [B, K+1, V] to the
accepted path and the next token, as the engine runs it (`engine.target_distribution` + `engine.verify`)
and as it ran before (the warp's one-hot p for greedy rows, then `tree_verify`), and the float64
inverse-CDF draw of a sampled row against the same draw over a float32 CDF.

Greedy rows need no vocabulary-wide tensor: `greedy_verify` reads p's hot ids. The float64 CDF is what
keeps the draw exact: a float32 running sum over V = 128k probabilities moves each token's boundaries by
up to half a unit in the last place of 1 (6e-8), a total-variation error up to ~V * 6e-8 = 0.008.

    python benchmarks/verify_tail.py [--device cuda]
"""

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import machine, report_header, write_report

from specexp.core.engine import target_distribution, verify
from specexp.core.sampling import SamplingConfig, logits_to_probs
from specexp.core.verify import tree_verify

GREEDY, SAMPLED = SamplingConfig(), SamplingConfig(temperature=0.7)


def timed(fn, device: str, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after two warm-ups, each to its end on the device."""
    times = []
    for i in range(repeats + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def cdf_draw(probs: torch.Tensor, generator, dtype: torch.dtype) -> torch.Tensor:
    """The inverse-CDF draw of core/sampling.sample with its running sum in ``dtype``."""
    cdf = probs.to(dtype).cumsum(-1)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device).to(dtype)
    return torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)


def measure(V: int, K: int, batch: int, device: str, repeats: int, g: torch.Generator) -> list[float]:
    """Seconds of: greedy now, greedy before, sampled verify, the float64 and the float32 CDF draws."""
    logits = 4 * torch.randn(batch, K + 1, V, generator=g, device=device)
    tokens = logits[:, :K].argmax(-1)
    tokens[:, K // 2 :] = (tokens[:, K // 2 :] + 1) % V  # half of them wrong: a rejection mid-chain
    one_hot = torch.zeros(batch, K, V, device=device).scatter_(-1, tokens[..., None], 1.0)
    q = logits_to_probs(logits[:, :K] + torch.randn_like(logits[:, :K]), SAMPLED)
    p = logits_to_probs(logits[:, 0], SAMPLED)
    return [timed(fn, device, repeats) for fn in (
        lambda: verify(tokens, None, one_hot, target_distribution(logits, GREEDY), GREEDY, g),
        lambda: tree_verify(tokens, None, one_hot, logits_to_probs(logits, GREEDY), g),
        lambda: verify(tokens, None, q, target_distribution(logits, SAMPLED), SAMPLED, g),
        lambda: cdf_draw(p, g, torch.float64),
        lambda: cdf_draw(p, g, torch.float32))]


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=lambda s: [int(v) for v in s.split(",")], default=[49152, 128256])
    parser.add_argument("--ks", type=lambda s: [int(k) for k in s.split(",")], default=[1, 4, 8])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("verify_tail.md"))
    args = parser.parse_args()
    g = torch.Generator(args.device).manual_seed(0)
    lines = report_header("The verify tail of a round: greedy from p's hot ids, and the float64 CDF")
    lines += [f"Device: {torch.cuda.get_device_name() if args.device == 'cuda' else machine()}; batch {args.batch}; "
              f"medians of {args.repeats} calls, each to its end on the device.", "",
              "| V | K | greedy now (hot ids) ms | greedy before (one-hot p) ms | before / now | "
              "sampled verify ms | draw, float64 CDF ms | draw, float32 CDF ms |", "|---|---|---|---|---|---|---|---|"]
    for V in args.vocab:
        for K in args.ks:
            now, before, sampled, f64, f32 = measure(V, K, args.batch, args.device, args.repeats, g)
            lines.append(f"| {V} | {K} | {1e3 * now:.3f} | {1e3 * before:.3f} | {before / now:.1f} | "
                         f"{1e3 * sampled:.3f} | {1e3 * f64:.3f} | {1e3 * f32:.3f} |")
            print(lines[-1], flush=True)
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
