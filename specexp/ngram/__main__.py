"""Build n-gram drafts for a target: `python -m specexp.ngram {lm,datastore} --out FILE [corpus]`.

  python -m specexp.ngram lm --out lm5.npz --order 5 --text 'texts/*.txt'
  python -m specexp.ngram datastore --out store.npz --prompts mt_bench --prompt-limit 40

The corpus is any mix of text data sets (--text, repeatable: local files, a glob of text
files, or an HF name) and the target's own generations on a prompt set (--prompts:
mt_bench, self (the target writes the user turns too) or a question.jsonl / json / csv file), all
tokenized with the target's tokenizer: `specexp.ngram.corpus.corpus_documents`, as the cached builds.
"""

import argparse
import sys

from specexp.cli import CommandParser, one_line_errors
from specexp.errors import UserInputError
from specexp.models import load_model
from specexp.models.embedded import load_embedded_target
from specexp.ngram.cached import datastore_from_documents, lm_from_documents
from specexp.ngram.corpus import corpus_documents


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(prog="python -m specexp.ngram", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["lm", "datastore"], help="a Kneser-Ney LM or a retrieval datastore")
    parser.add_argument("--out", required=True, help="output file (.npz)")
    parser.add_argument("--order", type=int, default=5, help="n-gram order of the LM (1..8)")
    parser.add_argument("--target", default="default", help="'default' (embedded SmolLM2) or a hub name / local folder")
    parser.add_argument("--device", default="auto", help="where the target runs: auto, cpu or cuda (default: auto)")
    parser.add_argument("--text", action="append", default=[], help="text data set: file, glob or HF name (repeatable)")
    parser.add_argument("--text-column", default="text",
                        help="the column holding the text in an HF data set (default: text)")
    parser.add_argument("--max-documents", type=int, default=None,
                        help="documents read of each text data set (default: all)")
    parser.add_argument("--prompts", default=None, help="prompt set the target answers: mt_bench, self or a file")
    parser.add_argument("--prompt-text-column", default="turns",
                        help="the column holding a prompt file's text (default: turns)")
    parser.add_argument("--prompt-limit", type=int, default=None, help="prompts the target answers (default: all)")
    parser.add_argument("--generation-tokens", type=int, default=128,
                        help="tokens the target writes per prompt (default: 128)")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the generations")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts the target answers together (default: 8)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the generations' sampling (default: 0)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> None:
    if not args.text and not args.prompts:
        raise UserInputError("no corpus given; pass --text and/or --prompts")
    target = (load_embedded_target(device=args.device) if args.target == "default"
              else load_model(args.target, device=args.device))
    if target.tokenizer is None:
        raise UserInputError(f"target '{target.name}' has no tokenizer")
    documents = corpus_documents(target, text=args.text, text_column=args.text_column, prompts=args.prompts,
                                 prompt_limit=args.prompt_limit, generation_tokens=args.generation_tokens,
                                 temperature=args.temperature, batch_size=args.batch_size, seed=args.seed,
                                 max_documents=args.max_documents, prompt_text_column=args.prompt_text_column)
    if args.kind == "lm":
        model = lm_from_documents(documents, target, args.order)
    else:
        model = datastore_from_documents(documents, target)
    model.save(args.out)
    n_tokens = sum(len(d) for d in documents)
    print(f"wrote {args.out}: {args.kind} over {len(documents)} documents, {n_tokens} tokens")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with one_line_errors():
        build(args)


if __name__ == "__main__":
    main()
