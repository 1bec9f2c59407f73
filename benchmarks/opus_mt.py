"""mtkit against Hugging Face transformers on a model of OPUS-MT's real size, side by side.

    python -m benchmarks.opus_mt [--sentences 200] [--repeats 3] [--threads 0] [--out benchmarks/results/opus_mt.json] [--smoke]

Builds a random Marian model of OPUS-MT's shape (d_model 512, 6+6 layers, 8 heads, FFN 2048, swish,
a vocabulary of 58,101 pieces: two SentencePiece models trained on Multi30k plus filler pieces),
saves it in the Hugging Face layout, imports it with `mtkit import marian` and exports it to
CTranslate2 int8. The same Multi30k test2016 English sentences then go through mtkit's PyTorch
engine, its CTranslate2 int8 export and `transformers`' `generate`, at beam 5 and greedy, each
output capped at the same fixed length (a random model rarely ends a sentence, so every system
decodes the same number of steps), the systems alternating A B C A B C; then where the CTranslate2
engine's beam-5 time goes (its search, its scoring of the hypotheses cut at the cap, mtkit around
them), for the int8 and the float32 export. Then one fine-tuning update
(forward, backward, Adam) of mtkit's model and of transformers' on the same batch, alternating.
Every timed run is a process of its own (built, warmed up once, timed once), so what one system sets
for the process (mtkit keeps freed heap memory, for one) never reaches another.
Prints the figures and the ratios, with the matmul peak of the same run, and writes JSON.
Needs `transformers` (pip install -e '.[dev]') and ctranslate2; offline. `--smoke`: a tiny random Marian
model (d_model 16, one layer a side) from the tests' slice, 8 sentences, each timed run in this process.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

from benchmarks import common, turns
from benchmarks.turns import alternate, report, timed
from mtkit.decoding.ct2_engine import load_export
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.exporters.ctranslate2 import export_ctranslate2
from mtkit.importers.marian import import_marian
from mtkit.runtime import set_threads
from mtkit.training.loss import sequence_loss

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
DECODERS = ["mtkit pytorch", "mtkit ctranslate2 int8", "transformers generate"]
# OPUS-MT's shape, and the SentencePiece models' training lines and size
OPUS_MT = {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 58101, "spm_lines": 29000, "spm_vocab": 6000}
SMOKE_SHAPE = {"d_model": 16, "layers": 1, "heads": 2, "ffn": 32, "vocab": 400, "spm_lines": 300, "spm_vocab": 150}


def sentencepiece(data: Path, lang: str, shape: dict) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(common.first_lines(data / f"train.{lang}.gz", shape["spm_lines"])),
        model_writer=model,
        vocab_size=shape["spm_vocab"],
        minloglevel=2,
    )
    return model.getvalue()


def build_opus_mt_sized(folder: Path, data: Path, shape: dict) -> None:
    """A random Marian model of OPUS-MT's size (`shape`) in the Hugging Face layout (transformers' own initialisation)."""
    from transformers import MarianConfig, MarianMTModel

    source, target = sentencepiece(data, "en", shape), sentencepiece(data, "fr", shape)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    pieces: list[str] = ["</s>", "<unk>"]
    for proto in (source, target):
        processor = spm.SentencePieceProcessor(model_proto=proto)
        pieces += [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    pieces = list(dict.fromkeys(pieces))
    pieces += [f"▁filler{i}" for i in range(shape["vocab"] - 1 - len(pieces))] + ["<pad>"]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "fr"}))
    config = MarianConfig(
        vocab_size=len(pieces),
        decoder_vocab_size=len(pieces),
        **common.transformers_shape(shape),
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=512,
        pad_token_id=len(pieces) - 1,
        eos_token_id=0,
        decoder_start_token_id=len(pieces) - 1,
        forced_eos_token_id=0,
    )
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(folder)


def decoding_system(name: str, scratch: Path, cap: int, beam: int) -> Callable[[list[str]], object]:
    """One way to translate sentences at `beam`, emitting at most `cap` tokens: mtkit's two engines or transformers."""
    if name == "transformers generate":
        from transformers import MarianMTModel

        hf_model, tokenizer = MarianMTModel.from_pretrained(scratch / "hf").eval(), marian_tokenizer(scratch / "hf")

        def transformers_generate(sources: list[str]) -> None:
            for start in range(0, len(sources), 16):
                batch = tokenizer(sources[start : start + 16], return_tensors="pt", padding=True)
                with torch.inference_mode():
                    hf_model.generate(**batch, num_beams=beam, max_new_tokens=cap + 1, do_sample=False)

        return transformers_generate
    if name == "mtkit pytorch":
        translator = Translator.load(scratch / "run", fast_paths=True)
    else:
        translator = Translator.over(load_export(scratch / "ct2"))
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.0, max_len_b=cap)
    return lambda sources: translator.translate_nbest(sources, Decoding(beam=beam))


def marian_tokenizer(folder: Path):  # noqa: ANN201 - transformers' MarianTokenizer
    from transformers import MarianTokenizer

    return MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"))


def update_system(name: str, scratch: Path, sources: list[str], targets: list[str]) -> Callable[[], object]:
    """One fine-tuning update (label smoothing 0.1, Adam) of mtkit's model or transformers' on the same pairs."""
    if name == "transformers":
        from transformers import MarianMTModel

        tokenizer = marian_tokenizer(scratch / "hf")
        batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
        labels = batch["labels"].masked_fill(batch["labels"].eq(tokenizer.pad_token_id), -100)
        hf_model = MarianMTModel.from_pretrained(scratch / "hf").train()
        hf_optimizer = torch.optim.Adam(hf_model.parameters(), lr=1e-5)

        def transformers_update() -> None:
            logits = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).logits
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1, reduction="sum"
            )
            loss.backward()
            hf_optimizer.step()
            hf_optimizer.zero_grad(set_to_none=True)

        return transformers_update
    translator = Translator.load(scratch / "run", fast_paths=True)
    mt_model = translator.engine.model.train()
    mt_optimizer = torch.optim.Adam(mt_model.parameters(), lr=1e-5)
    src_ids = [translator.tokenizers.src.encode(s) + [3] for s in sources]
    tgt_ids = [translator.tokenizers.tgt.encode(t) for t in targets]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in src_ids], batch_first=True)
    tgt_in = torch.nn.utils.rnn.pad_sequence([torch.tensor([2, *t]) for t in tgt_ids], batch_first=True)
    gold = torch.nn.utils.rnn.pad_sequence([torch.tensor([*t, 3]) for t in tgt_ids], batch_first=True)

    def mtkit_update() -> None:
        loss = sequence_loss(mt_model(src, src.ne(0), tgt_in), gold, label_smoothing=0.1)
        loss.backward()
        mt_optimizer.step()
        mt_optimizer.zero_grad(set_to_none=True)

    return mtkit_update


class _TimedCalls:
    """A ctranslate2.Translator whose translate_batch and score_batch add their seconds to `seconds`."""

    def __init__(self, model: Any, seconds: dict[str, float]) -> None:
        self._model, self.seconds = model, seconds

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._model, name)
        if name not in self.seconds:
            return method

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return timed_call


def ct2_split(export: Path, task: dict) -> dict[str, float]:
    """Where a CTranslate2 export's beam-5 time goes (one run after a warm-up): CTranslate2's search
    (translate_batch), its scoring of the hypotheses cut at the cap (score_batch), and mtkit around them."""
    translator = Translator.over(load_export(export))
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.0, max_len_b=task["cap"])
    seconds = {"translate_batch": 0.0, "score_batch": 0.0}
    translator.engine.model = _TimedCalls(translator.engine.model, seconds)
    translator.translate_nbest(task["sources"][:8], Decoding(beam=5))
    seconds.update(translate_batch=0.0, score_batch=0.0)
    total = timed(lambda: translator.translate_nbest(task["sources"], Decoding(beam=5)))
    return {"total": total, **seconds, "mtkit": total - sum(seconds.values())}


def child(task: dict) -> float | dict[str, float]:
    """One timed run, meant for a process of its own (so no system's allocator or thread settings reach another).

    The system is built, warmed up (one update, or eight sentences) and timed once: its seconds.
    """
    set_threads(task["threads"])
    scratch = Path(task["scratch"])
    if task["kind"] == "ct2_split":
        return ct2_split(scratch / task["export"], task)
    if task["kind"] == "update":
        update = update_system(task["system"], scratch, task["sources"], task["targets"])
        update()
        return timed(update)
    translate = decoding_system(task["system"], scratch, task["cap"], task["beam"])
    translate(task["sources"][:8])
    return timed(lambda: translate(task["sources"]))


def child_process(task: dict) -> float | dict[str, float]:
    """`child(task)` in a fresh process (`python -m benchmarks.opus_mt --child TASK`); its seconds."""
    return turns.in_own_process("benchmarks.opus_mt", task)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=200, help="Multi30k test2016 sentences decoded")
    parser.add_argument("--cap", type=int, default=40, help="output tokens per sentence (a fixed cap for every system)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-pairs", type=int, default=32, help="sentence pairs in the fine-tuning batch")
    parser.add_argument("--threads", type=int, default=0, help="torch and CTranslate2 threads (0: all cores)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/opus_mt.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one timed run, started by alternate()
    common.add_smoke_options(parser)
    parser.set_defaults(data=DATA, shape=OPUS_MT, run_child=child_process)  # --smoke: tiny, in this process
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: a tiny Marian model from the first lines of the tests' slice (in `work`), 8 sentences, in this process."""
    args.data, args.shape, args.run_child = common.smoke_corpus(work), SMOKE_SHAPE, child
    args.sentences, args.cap, args.repeats, args.batch_pairs, args.threads = 8, 5, 1, 4, 1


def run_benchmark(args: argparse.Namespace) -> dict:
    """Build, import and export the model; decoding at beam 5 and greedy, then one update; prints each comparison."""
    set_threads(args.threads)
    sources = common.first_lines(args.data / "test_2016_flickr.en.gz", args.sentences)
    targets = common.first_lines(args.data / "test_2016_flickr.fr.gz", args.sentences)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "hf").mkdir()
        build_opus_mt_sized(Path(scratch) / "hf", args.data, args.shape)
        import_marian(str(Path(scratch) / "hf"), Path(scratch) / "run")
        export_ctranslate2(Path(scratch) / "run", Path(scratch) / "ct2", quantization="int8")
        result = {**common.smoke_label(args), "date": datetime.date.today().isoformat()}
        result |= {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
        result |= {"matmul_gflops": common.matmul_gflop_per_s(smoke=args.smoke)}
        model = {key: value for key, value in args.shape.items() if not key.startswith("spm_")}
        result |= {"model": model, "sentences": len(sources), "cap": args.cap, "repeats": args.repeats}
        task = {"scratch": scratch, "threads": args.threads, "sources": sources, "cap": args.cap}
        for beam in (5, 1):
            times = alternate({**task, "kind": "decode", "beam": beam}, DECODERS, args.repeats, args.run_child)
            result[f"beam{beam}_seconds"] = {name: round(statistics.median(t), 3) for name, t in times.items()}
            report(f"beam {beam}, {len(sources)} sentences x {args.cap} tokens", result[f"beam{beam}_seconds"], DECODERS[-1])
        export_ctranslate2(Path(scratch) / "run", Path(scratch) / "ct2_float32", quantization=None)
        result["ct2_beam5_split_seconds"] = {
            export: {k: round(v, 3) for k, v in args.run_child({**task, "kind": "ct2_split", "export": export}).items()}
            for export in ("ct2", "ct2_float32")
        }
        report_split(result["ct2_beam5_split_seconds"])
        pairs = {"sources": sources[: args.batch_pairs], "targets": targets[: args.batch_pairs]}
        times = alternate({**task, **pairs, "kind": "update"}, ["mtkit", "transformers"], args.repeats, args.run_child)
        result["update_seconds"] = {name: round(statistics.median(t), 3) for name, t in times.items()}
        report(f"one fine-tuning update, {args.batch_pairs} pairs", result["update_seconds"], "transformers")
    return result


def main() -> None:
    args = parse_args()
    if args.child:
        turns.answer_child(child, args.child)
        return
    result = common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    print(f"matmul peak {result['matmul_gflops']} GFLOP/s, {result['threads']} threads; written to {args.out}")


def report_split(split: dict[str, dict[str, float]]) -> None:
    print("CTranslate2 beam 5, where the time goes (s): search, scoring of cut hypotheses, mtkit")
    for export, parts in split.items():
        name = "int8" if export == "ct2" else "float32"
        print(
            f"  {name:<8} total {parts['total']:7.2f}  translate_batch {parts['translate_batch']:7.2f}  "
            f"score_batch {parts['score_batch']:7.2f}  mtkit {parts['mtkit']:6.2f}"
        )


if __name__ == "__main__":
    main()
