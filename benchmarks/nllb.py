"""mtkit against Hugging Face transformers on a model of NLLB-200-distilled-600M's shape, side by side.

    python -m benchmarks.nllb [--sentences 40] [--batch 8] [--cap 40] [--repeats 2] [--batch-pairs 8]
        [--checkpoint-activations] [--threads 0] [--out benchmarks/results/nllb.json] [--smoke]

Builds a random M2M100ForConditionalGeneration of NLLB-600M's shape (d_model 1024, 12+12 layers, 16 heads, FFN
4096, ReLU, no LayerDrop, a vocabulary of 256,206 rows in NLLB's id layout: a BPE SentencePiece model trained on
Multi30k German and English, filled up to 256,000 pieces, NLLB's 202 language codes and <mask> as
`NllbTokenizer` numbers them, and two rows past the tokenizer's, as the real model has), saves it in the Hugging
Face layout (safetensors, the tokenizer's own files) and imports it with `mtkit import auto`, each step a
process of its own, its seconds and peak memory reported. The same Multi30k test2016 German sentences are then
translated into English (source code deu_Latn, target code eng_Latn forced first) by mtkit's PyTorch engine
(its fast paths on, as the CLI loads it) and by transformers' `generate(forced_bos_token_id=...)`, at beam 5 and
greedy, in the same batches of `--batch` sentences, every output capped at `--cap` tokens with the code (a
random model rarely ends a sentence, so both decode about the same number of steps), fp32, the systems taking
turns (A B A B). Then one fine-tuning update (forward, backward, Adam: label smoothing 0.1, the same
`--batch-pairs` pairs) of each system's model, taking turns, with each process's peak RSS: mtkit's set up as
`mtkit train` sets it up (its step module, its Adam, fused on the CPU), transformers' with `torch.optim.Adam`; with
`--checkpoint-activations` also mtkit's update with `train.checkpoint_activations` on. Every timed run is a
process of its own (built, warmed up once, timed once): one fp32 Adam update of 600M parameters needs about
10 GB, and the processes run one after another. Prints the figures and the ratios with the matmul peak of the
same run and writes JSON. Needs `transformers` (pip install -e '.[dev]'); offline. `--smoke`: a tiny model of
the same layout (d_model 16, one layer a side, a few hundred pieces and the codes) from the tests' slice, every
run in this process, in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import io
import platform
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import sentencepiece as spm
import torch
from sentencepiece import sentencepiece_model_pb2

from benchmarks import common, turns
from benchmarks.turns import alternate, peak_rss_mb, report, timed
from mtkit.config import TrainConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.decoding.languages import Languages
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.models.checkpoint import load_model
from mtkit.runtime import set_threads
from mtkit.training.finetune import train_as_family
from mtkit.training.levers import Levers
from mtkit.training.trainer import build_optimizer, setup_process, training_forward

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
SRC_LANG, TGT_LANG = "deu_Latn", "eng_Latn"
DECODERS = ["mtkit pytorch", "transformers generate"]
UPDATERS = ["mtkit", "transformers"]
# NLLB-600M's shape; the SentencePiece model's training lines and learned pieces, and its size once filled
NLLB_600M = {"d_model": 1024, "layers": 12, "heads": 16, "ffn": 4096, "pieces": 256000, "spm_lines": 29000, "spm_vocab": 8000}
SMOKE_SHAPE = {"d_model": 16, "layers": 1, "heads": 2, "ffn": 32, "pieces": 400, "spm_lines": 300, "spm_vocab": 200}
ROWS_PAST_TOKENIZER = 2  # NLLB's config.json: vocab_size 256,206 for the tokenizer's 256,204 ids


def filled_sentencepiece(data: Path, shape: dict) -> bytes:
    """A BPE SentencePiece model learned on Multi30k German and English, filled with pieces no text holds (scored
    below every learned one) up to `shape["pieces"]`, so that the ids and the output layer have NLLB's size."""
    lines = [line for lang in ("de", "en") for line in common.first_lines(data / f"train.{lang}.gz", shape["spm_lines"])]
    learned = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=learned, vocab_size=shape["spm_vocab"], model_type="bpe", minloglevel=2
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(learned.getvalue())
    lowest = min(piece.score for piece in proto.pieces)
    for index in range(shape["pieces"] - len(proto.pieces)):
        proto.pieces.add(
            piece=f"⁂{index}", score=lowest - 1 - index, type=sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
        )
    return proto.SerializeToString()


def build_nllb_shaped(folder: Path, data: Path, shape: dict) -> int:
    """A random NLLB-shaped model (transformers' own initialisation) with NllbTokenizer's files, saved in `folder`;
    its vocabulary's size."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentencepiece.bpe.model").write_bytes(filled_sentencepiece(data, shape))
    tokenizer = NllbTokenizer.from_pretrained(folder, extra_special_tokens=FAIRSEQ_LANGUAGE_CODES, src_lang=SRC_LANG)
    tokenizer.save_pretrained(folder)
    config = M2M100Config(
        vocab_size=len(tokenizer) + ROWS_PAST_TOKENIZER,
        **common.transformers_shape(shape),
        encoder_layerdrop=0.0,  # NLLB-600M's; transformers' default 0.05 would skip layers in training
        decoder_layerdrop=0.0,
        max_position_embeddings=1024,
        scale_embedding=True,
        activation_function="relu",
    )
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config)
    model.save_pretrained(folder)  # safetensors, the tied embeddings once
    return config.vocab_size


def hf_parts(folder: Path, training: bool):  # noqa: ANN201 - transformers' model and NllbTokenizer
    """transformers' model (eval or train mode) and tokenizer, as a transformers user loads them."""
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer

    model = M2M100ForConditionalGeneration.from_pretrained(folder)
    tokenizer = NllbTokenizer.from_pretrained(folder, src_lang=SRC_LANG, tgt_lang=TGT_LANG)
    return model.train(training), tokenizer


def decoding_system(name: str, scratch: Path, task: dict) -> Callable[[list[str]], int]:
    """One way to translate sentences at the task's beam in batches of `batch`, at most `cap` tokens (with the
    target's code) each: mtkit's PyTorch engine or transformers; it returns the tokens it wrote."""
    beam, cap, batch = task["beam"], task["cap"], task["batch"]
    if name == "transformers generate":
        model, tokenizer = hf_parts(scratch / "hf", training=False)
        # the code forced first and </s> forced last, as mtkit ends an output at its cap: cap + 1 steps each
        forced = {"forced_bos_token_id": tokenizer.convert_tokens_to_ids(TGT_LANG), "forced_eos_token_id": tokenizer.eos_token_id}

        def transformers_generate(sources: list[str]) -> int:
            written = 0
            for start in range(0, len(sources), batch):
                inputs = tokenizer(sources[start : start + batch], return_tensors="pt", padding=True)
                with torch.inference_mode():
                    output = model.generate(**inputs, num_beams=beam, max_new_tokens=cap + 1, do_sample=False, **forced)
                out = output[:, 1:]  # after the decoder's start
                written += int((out.ne(tokenizer.pad_token_id) & out.ne(tokenizer.eos_token_id)).sum())
            return written

        return transformers_generate
    translator = Translator.load(scratch / "run", fast_paths=True)
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.0, max_len_b=cap, batch_beam_tokens=10**9)
    decoding = Decoding(beam=beam, tgt_lang=TGT_LANG, src_lang=SRC_LANG)

    def mtkit_translate(sources: list[str]) -> int:
        found = [translator.translate_nbest(sources[i : i + batch], decoding) for i in range(0, len(sources), batch)]
        return sum(len(best[0].tokens) for chunk in found for best in chunk)

    return mtkit_translate


def transformers_update(scratch: Path, sources: list[str], targets: list[str]) -> tuple[Callable[[], object], int]:
    """One update of transformers' model (its teacher-forced logits, label-smoothed summed loss, backward, Adam) and
    the target tokens it learns from."""
    from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right

    model, tokenizer = hf_parts(scratch / "hf", training=True)
    batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
    decoder_input_ids = shift_tokens_right(batch["labels"], tokenizer.pad_token_id, model.config.decoder_start_token_id)
    labels = batch["labels"].masked_fill(batch["labels"].eq(tokenizer.pad_token_id), -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)

    def update() -> None:
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids
        ).logits
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1, reduction="sum"
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update, int(labels.ne(-100).sum())


def mtkit_update(scratch: Path, sources: list[str], targets: list[str], task: dict) -> tuple[Callable[[], object], int]:
    """One update of mtkit's model as `mtkit train --init-from` sets it up (the process: `setup_process`; the step's
    module: `training_forward`, mtkit's loss, activation checkpointing if asked; its Adam: `build_optimizer`; the
    family's rows: `train_as_family`) and the
    target tokens it learns from."""
    settings = TrainConfig(lr=1e-5, device="cpu", threads=task["threads"], checkpoint_activations=task["recompute"])
    distributed, device = setup_process(settings)
    model, config, tokenizers, _ = load_model(scratch / "run")
    model.train()
    train_as_family(model, config)  # one </s> row (its rows' gradients summed), the output bias not trained
    forward = training_forward(model, settings, distributed=distributed, device=device, levers=Levers.of(settings, device))
    optimizer, _ = build_optimizer(model, settings, device=device)
    source_code, (target_code,) = Languages(config, tokenizers).leads(SRC_LANG, TGT_LANG)
    targets_ids = [[target_code, *tokenizers.tgt.encode(text)] for text in targets]

    def padded(rows: list[list[int]]) -> torch.Tensor:
        return torch.nn.utils.rnn.pad_sequence([torch.tensor(row) for row in rows], batch_first=True, padding_value=PAD_ID)

    src = padded([[source_code, *tokenizers.src.encode(text), EOS_ID] for text in sources])
    tgt_in, tgt_out = padded([[BOS_ID, *ids] for ids in targets_ids]), padded([[*ids, EOS_ID] for ids in targets_ids])

    def update() -> None:
        forward(src, src.ne(PAD_ID), tgt_in, tgt_out).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update, int(tgt_out.ne(PAD_ID).sum())


def child(task: dict) -> dict:
    """One step or timed run, meant for a process of its own: the model built or imported, or a system built,
    warmed up (one update, or one batch) and timed once; its seconds and the process's peak RSS."""
    set_threads(task["threads"])
    scratch = Path(task["scratch"])
    if task["kind"] == "build":
        vocab: list[int] = []
        seconds = timed(lambda: vocab.append(build_nllb_shaped(scratch / "hf", Path(task["data"]), task["shape"])))
        return {"seconds": round(seconds, 2), "peak_rss_mb": peak_rss_mb(), "vocab": vocab[0]}
    if task["kind"] == "import":
        arguments = ["import", "auto", scratch / "hf", "-o", scratch / "run"]
        seconds = timed(lambda: common.MtkitCommands(in_process=True).run(arguments))
        return {"seconds": round(seconds, 2), "peak_rss_mb": peak_rss_mb()}
    if task["kind"] == "update":
        pairs = task["sources"], task["targets"]
        system = task["system"]
        update, tokens = transformers_update(scratch, *pairs) if system == "transformers" else mtkit_update(scratch, *pairs, task)
        update()
        return {"seconds": timed(update), "target_tokens": tokens, "peak_rss_mb": peak_rss_mb()}
    translate = decoding_system(task["system"], scratch, task)
    translate(task["sources"][: task["batch"]])
    written: list[int] = []
    seconds = timed(lambda: written.append(translate(task["sources"])))
    return {"seconds": seconds, "tokens": written[0], "peak_rss_mb": peak_rss_mb()}


def child_process(task: dict) -> dict:
    """`child(task)` in a fresh process (`python -m benchmarks.nllb --child TASK`)."""
    return turns.in_own_process("benchmarks.nllb", task)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=40, help="Multi30k test2016 German sentences translated")
    parser.add_argument("--batch", type=int, default=8, help="sentences per batch, the same for both systems")
    parser.add_argument("--cap", type=int, default=40, help="output tokens per sentence with the target's code (both)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each system, taking turns")
    parser.add_argument("--beams", default="5,1", help="the beam sizes timed, e.g. 5,1; none: the update alone")
    parser.add_argument("--batch-pairs", type=int, default=8, help="sentence pairs in the fine-tuning batch")
    parser.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="also time mtkit's update with train.checkpoint_activations on, with its peak RSS",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/nllb.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one step or timed run, started by run_benchmark
    common.add_smoke_options(parser)
    parser.set_defaults(data=DATA, shape=NLLB_600M, run_child=child_process)  # --smoke: tiny, in this process
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: a tiny NLLB-shaped model from the first lines of the tests' slice (in `work`), in this process."""
    args.data, args.shape, args.run_child = common.smoke_corpus(work), SMOKE_SHAPE, child
    args.sentences, args.batch, args.cap, args.repeats, args.batch_pairs, args.threads = 6, 4, 5, 1, 4, 1
    args.checkpoint_activations = True


def run_benchmark(args: argparse.Namespace) -> dict:
    """Build and import the model; decoding at beam 5 and greedy, then one update; prints each comparison."""
    set_threads(args.threads)
    sources = common.first_lines(args.data / "test_2016_flickr.de.gz", args.sentences)
    targets = common.first_lines(args.data / "test_2016_flickr.en.gz", args.sentences)
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat()}
    result |= {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    result |= {"matmul_gflops": common.matmul_gflop_per_s(smoke=args.smoke)}
    result |= {"versions": {name: importlib.metadata.version(name) for name in ("torch", "transformers")}}
    model = {key: value for key, value in args.shape.items() if not key.startswith("spm_")}
    result |= {"model": model, "sentences": len(sources), "batch": args.batch, "cap": args.cap, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as scratch:
        task = {"scratch": scratch, "threads": args.threads}
        build = {"kind": "build", "data": str(args.data), "shape": args.shape}
        result["build"] = {step: args.run_child({**task, **build, "kind": step}) for step in ("build", "import")}
        result["model"]["vocab"] = result["build"]["build"].pop("vocab")
        report_build(result["build"])
        task |= {"sources": sources, "cap": args.cap, "batch": args.batch}
        for beam in [] if args.beams == "none" else [int(size) for size in args.beams.split(",")]:
            runs = alternate({**task, "kind": "decode", "beam": beam}, DECODERS, args.repeats, args.run_child)
            result[f"beam{beam}"] = decoding_figures(runs, len(sources))
            title = f"beam {beam}, {len(sources)} sentences in batches of {args.batch}, at most {args.cap} tokens each"
            report_decoding(title, result[f"beam{beam}"])
        pairs = {"sources": sources[: args.batch_pairs], "targets": targets[: args.batch_pairs], "recompute": False}
        runs = alternate({**task, **pairs, "kind": "update"}, UPDATERS, args.repeats, args.run_child)
        result["update"] = update_figures(runs)
        if args.checkpoint_activations:
            recomputed = args.run_child({**task, **pairs, "kind": "update", "recompute": True, "system": "mtkit"})
            result["update"] |= update_figures({"mtkit checkpointed": [recomputed]})
        report_update(f"one fine-tuning update, {len(pairs['sources'])} pairs", result["update"])
    return result


def decoding_figures(runs: dict[str, list[dict]], sentences: int) -> dict[str, dict]:
    """Each system's median seconds, the tokens it wrote, sentences/s and tokens/s, and its peak RSS."""
    figures = {}
    for name, found in runs.items():
        seconds = statistics.median(run["seconds"] for run in found)
        tokens = found[0]["tokens"]
        figures[name] = {"seconds": round(seconds, 3), "tokens": tokens, "sentences_per_s": round(sentences / seconds, 2)}
        figures[name] |= {"tokens_per_s": round(tokens / seconds, 1), "peak_rss_mb": max(run["peak_rss_mb"] for run in found)}
    return figures


def update_figures(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each system's median seconds of one update, the target tokens it learned from and the largest peak RSS of its
    processes."""
    return {
        name: {
            "seconds": round(statistics.median(run["seconds"] for run in found), 3),
            "target_tokens": found[0]["target_tokens"],
            "peak_rss_mb": max(run["peak_rss_mb"] for run in found),
        }
        for name, found in runs.items()
    }


def report_build(build: dict[str, dict]) -> None:
    for step, figures in build.items():
        print(f"{step}: {figures['seconds']:.1f} s, peak RSS {figures['peak_rss_mb']:.0f} MB")


def report_decoding(title: str, figures: dict[str, dict]) -> None:
    report(title, {name: row["seconds"] for name, row in figures.items()}, DECODERS[-1])
    for name, row in figures.items():
        print(
            f"  {name:<24} {row['tokens']} tokens, {row['tokens_per_s']:.1f} tokens/s, {row['sentences_per_s']:.2f} sentences/s"
        )


def report_update(title: str, figures: dict[str, dict]) -> None:
    report(title, {name: row["seconds"] for name, row in figures.items()}, "transformers")
    for name, row in figures.items():
        print(f"  {name:<24} {row['target_tokens']} target tokens, peak RSS {row['peak_rss_mb']:.0f} MB")


def main() -> None:
    args = parse_args()
    if args.child:
        turns.answer_child(child, args.child)
        return
    result = common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    print(f"matmul peak {result['matmul_gflops']} GFLOP/s, {result['threads']} threads; written to {args.out}")


if __name__ == "__main__":
    main()
