"""specexp's EAGLE-3 against the reference implementation, vllm-project/speculators 0.7.0, both ways.

(a) speculators -> specexp: a random EAGLE-3 speculator for the default target built with speculators'
own classes and saved by them (benchmarks/speculators_side.py, in speculators' own venv) loads in specexp
(`draft=eagle draft.head=PATH`), and both compute the head's logits on the same features and tokens.
(b) specexp -> speculators: a head made here (`student=eagle3`), written by `python -m specexp.export`,
loads with speculators' `Eagle3DraftModel.from_pretrained` (its safetensors keys against the model's
state_dict: none missing, none unexpected), and both compute the logits the same way.

Each way runs twice: with the published defaults and with the flags speculators trains with
(norm_before_residual, norm_before_fc, norm_output). The features are the default target's at its
layers 2, 15, 27 on an MT-bench prompt, in fp32; the logits are the first draft step's at every position.
It prints max |delta logit| and top-1 agreement per direction. The tolerance held is 1e-4: both sides
compute in fp32 with different attention kernels (SDPA here, eager matmul and softmax there), which
differ in the last bits, far below the spread of logits that decides a draft's tokens.

    bash benchmarks/speculators_check.sh     (builds speculators' venv once, then runs this)
    python benchmarks/speculators_check.py --speculators-python VENV/bin/python
"""

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import torch
from common import report_header, write_report

from specexp.data import encode_prompts, mt_bench
from specexp.distill.features import eagle3_student, teacher_pass
from specexp.draft_vocab import DraftVocab, vocab_fingerprint
from specexp.drafts.eagle import resolve_head
from specexp.drafts.parts.eagle_head import eagle3_layers
from specexp.export import export
from specexp.models.embedded import load_embedded_target

FLAG_SETS = {"published defaults": (), "speculators' training flags": ("norm_before_residual", "norm_before_fc",
                                                                        "norm_output")}
TOLERANCE = 1e-4


@torch.no_grad()
def specexp_logits(head, inputs: dict) -> torch.Tensor:
    """The head's first draft step at every position: entry t reads features t and token t (the next one)."""
    features, tokens = inputs["features"], inputs["tokens"]  # [1, T, F], [1, T]
    padded_tokens = torch.cat([tokens[:, :1], tokens], dim=1)  # unrolled() reads token t+1 beside features t
    padded_features = torch.cat([features, features[:, :1]], dim=1)
    return head.unrolled(padded_tokens, padded_features, 1)[0][0].float()


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    return {"max_abs_delta": float((ours - theirs).abs().max()),
            "top1_agreement": float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())}


def randomised(head) -> None:
    """Weights away from their initial values (norms off 1, a random head), so a mixed-up part shows."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name.endswith("norm.weight") or ".norm" in name or "fc_norm" in name or name.startswith("input_norm"):
                parameter.uniform_(0.5, 1.5)
        head.lm_head.weight.normal_(0, 0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speculators-python", required=True, help="the python of a venv with speculators 0.7.0")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("speculators_check.md"))
    args = parser.parse_args()
    side = str(Path(__file__).with_name("speculators_side.py"))
    version = subprocess.run([args.speculators_python, "-c", "from importlib.metadata import version as v; "
                              "print(v('speculators'), v('transformers'))"],
                             capture_output=True, text=True, check=True).stdout.split()
    target = load_embedded_target(dtype="float32", device="cpu")
    n_layers = target.model.config.num_hidden_layers
    work = Path(tempfile.mkdtemp(prefix="speculators-check-"))
    verifier = work / target.name  # the verifier's folder is named as the target, as a hub name's last part
    target.model.save_pretrained(verifier)
    ids = torch.tensor([encode_prompts(target.tokenizer, mt_bench()[:1], chat_template=True)[0][:64]])
    features = teacher_pass(target.model, ids, eagle3_layers(n_layers))[1]
    inputs = {"features": features[:, :-1].float().contiguous(), "tokens": ids[:, 1:].contiguous()}
    torch.save(inputs, work / "inputs.pt")
    rows = []
    for label, flags in FLAG_SETS.items():
        name = label.split()[0].strip("'")
        # (a) speculators -> specexp
        built, logits = work / f"built-{name}", work / f"logits-a-{name}.pt"
        subprocess.run([args.speculators_python, side, "build", "--verifier", str(verifier), "--out", str(built),
                        "--inputs", str(work / "inputs.pt"), "--logits", str(logits),
                        *[f"--{flag.replace('_', '-')}" for flag in flags]], check=True)
        loaded = resolve_head(target, str(built))
        rows.append({"direction": "speculators -> specexp", "flags": label,
                     **compare(specexp_logits(loaded, inputs), torch.load(logits)[0].float()), "missing": "-",
                     "unexpected": "-"})
        # (b) specexp -> speculators
        vocab_ids = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(2))[:8192].sort().values
        vocab = DraftVocab(vocab_ids.tolist(), target.vocab_size, vocab_fingerprint(target))
        head = eagle3_student(target, draft_vocab=vocab, **dict.fromkeys(flags, True)).model.eval()
        randomised(head)
        head.save(work / f"trained-{name}")
        served, keys, logits = work / f"served-{name}", work / f"keys-{name}.json", work / f"logits-b-{name}.pt"
        export(work / f"trained-{name}", served, verifier=str(verifier))
        subprocess.run([args.speculators_python, side, "load", "--head", str(served),
                        "--inputs", str(work / "inputs.pt"), "--logits", str(logits), "--keys", str(keys)], check=True)
        found = json.loads(keys.read_text())
        rows.append({"direction": "specexp -> speculators", "flags": label,
                     **compare(specexp_logits(head, inputs), torch.load(logits)[0].float()),
                     "missing": ", ".join(found["missing"]) or "none",
                     "unexpected": ", ".join(found["unexpected"]) or "none"})
        print(json.dumps(rows[-2:]))
    lines = report_header("EAGLE-3 against speculators' reference implementation, both ways")
    lines += [f"speculators {version[0]} with transformers {version[1]} in its own venv; specexp with transformers "
              f"{__import__('transformers').__version__}. Default target ({target.name}), features of its layers "
              f"{list(eagle3_layers(n_layers))} on an MT-bench prompt of {ids.shape[1]} tokens, fp32, "
              f"a draft vocabulary of 8192 ids; tolerance held: max |delta logit| <= {TOLERANCE}.", "",
              "| direction | flags | max abs delta logit | top-1 agreement | missing keys | unexpected keys | within |",
              "|---|---|---|---|---|---|---|"]
    for row in rows:
        within = (row["max_abs_delta"] <= TOLERANCE and row["missing"] in ("-", "none")
                  and row["unexpected"] in ("-", "none"))
        lines.append(f"| {row['direction']} | {row['flags']} | {row['max_abs_delta']:.2e} | "
                     f"{row['top1_agreement']:.4f} | {row['missing']} | {row['unexpected']} | {within} |")
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
