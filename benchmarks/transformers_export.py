"""How exactly a `mtkit export --format transformers` folder agrees with mtkit, on Multi30k test2016.

    python -m benchmarks.transformers_export --model RUN [--sentences 1000] [--lang de] [--out FILE] [--smoke]

Exports the run (or checkpoint) to a temporary folder and loads it with transformers'
AutoTokenizer and AutoModelForSeq2SeqLM (trust_remote_code for mtkit's own form). Measures the
largest gap between the teacher-forced log-probabilities of the references and `mtkit score`'s,
the share of sentences whose greedy tokens are identical (each capped like mtkit's search), and
beam-5 BLEU of mtkit and of transformers' generate (the export's generation config). Needs
`transformers` (a dev extra). `--smoke`: the tiny model on 10 sentences.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
from pathlib import Path

import sacrebleu
import torch

from benchmarks import common
from mtkit.decoding.engine import output_cap
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.exporters.transformers import export_transformers

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
TARGET = {"de": "en", "en": "de", "fr": "en", "cs": "en"}


def load(folder: Path):  # noqa: ANN201 - transformers' (tokenizer, model)
    import transformers

    remote = (folder / "modeling_mtkit.py").is_file()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
    return tokenizer, transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=remote).eval()


def log_prob_gap(tokenizer, model, translator: Translator, sources: list[str], references: list[str]) -> float:  # noqa: ANN001
    """The largest |transformers - mtkit| teacher-forced log-probability of a reference (EOS included)."""
    theirs = []
    for start in range(0, len(sources), 50):
        batch = tokenizer(
            sources[start : start + 50], text_target=references[start : start + 50], return_tensors="pt", padding=True
        )
        labels = batch.pop("labels")
        first = torch.full((labels.size(0), 1), model.config.decoder_start_token_id)
        with torch.no_grad():
            logits = model(**batch, decoder_input_ids=torch.cat([first, labels[:, :-1]], dim=1)).logits
        picked = torch.log_softmax(logits.float(), dim=-1).gather(2, labels.unsqueeze(2)).squeeze(2)
        theirs += [float(row[label != tokenizer.pad_token_id].sum()) for row, label in zip(picked, labels, strict=True)]
    mine = [score.log_prob for score in translator.score(sources, references)]
    return max(abs(a - b) for a, b in zip(theirs, mine, strict=True))


def greedy_identical(tokenizer, model, translator: Translator, sources: list[str]) -> int:  # noqa: ANN001
    """How many sentences get the same greedy tokens from transformers as from mtkit (one at a time, mtkit's cap)."""
    ours = [found[0].tokens for found in translator.translate_nbest(sources, Decoding(beam=1))]
    same = 0
    for line, tokens in zip(sources, ours, strict=True):
        batch = tokenizer([line], return_tensors="pt")
        cap = output_cap(batch["input_ids"].size(1), translator.decode, max_positions=translator.engine.max_positions)
        ids = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=cap)[0].tolist()
        same += [i for i in ids[1:] if i != model.config.eos_token_id] == tokens
    return same


def beam5(tokenizer, model, sources: list[str]) -> list[str]:  # noqa: ANN001
    found = []
    for start in range(0, len(sources), 32):
        batch = tokenizer(sources[start : start + 32], return_tensors="pt", padding=True)
        with torch.no_grad():
            found += tokenizer.batch_decode(model.generate(**batch, num_beams=5), skip_special_tokens=True)
    return found


def run_benchmark(args: argparse.Namespace) -> dict:
    sources = common.first_lines(args.data / f"test_2016_flickr.{args.lang}.gz", args.sentences)
    references = common.first_lines(args.data / f"test_2016_flickr.{TARGET[args.lang]}.gz", args.sentences)
    translator = Translator.load([args.model], fast_paths=True)
    with tempfile.TemporaryDirectory(prefix="mtkit-hf-") as scratch:
        folder = export_transformers(args.model, Path(scratch) / "export")
        form = "remote-code" if (folder / "modeling_mtkit.py").is_file() else "marian"
        tokenizer, model = load(folder)
        gap = log_prob_gap(tokenizer, model, translator, sources, references)
        same = greedy_identical(tokenizer, model, translator, sources)
        theirs = beam5(tokenizer, model, sources)
    ours = translator.translate(sources, beam=5)
    bleu = {
        "mtkit": sacrebleu.corpus_bleu(ours, [references]).score,
        "transformers": sacrebleu.corpus_bleu(theirs, [references]).score,
    }
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat(), "model": str(args.model), "form": form}
    result |= {"sentences": len(sources), "max_log_prob_gap": gap, "greedy_identical": same}
    result |= {
        "beam5_bleu": {name: round(score, 2) for name, score in bleu.items()},
        "beam5_identical": sum(map(str.__eq__, ours, theirs)),
    }
    print(f"{form} export of {args.model}: {len(sources)} sentences; largest log-probability gap {gap:.2e}; "
          f"greedy identical {same}/{len(sources)}; beam-5 BLEU mtkit {bleu['mtkit']:.2f}, transformers "
          f"{bleu['transformers']:.2f} ({result['beam5_identical']} outputs identical)")  # fmt: skip
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a run directory or checkpoint; required but with --smoke")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--lang", default="de", choices=sorted(TARGET), help="source language of the test2016 sentences")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/transformers_export.json"))
    parser.set_defaults(data=DATA)
    return common.parsed_with_model(parser)


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    args.model, args.data, args.sentences = common.smoke_run(work), common.smoke_corpus(work), 10


def main() -> None:
    args = parse_args()
    common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)


if __name__ == "__main__":
    main()
