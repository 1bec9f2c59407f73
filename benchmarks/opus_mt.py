"""mtkit against Hugging Face transformers on a model of OPUS-MT's real size, side by side.

    python benchmarks/opus_mt.py [--sentences 200] [--repeats 3] [--threads 0] [--out benchmarks/results/opus_mt.json]

Builds a random Marian model of OPUS-MT's shape (d_model 512, 6+6 layers, 8 heads, FFN 2048, swish,
a vocabulary of 58,101 pieces: two SentencePiece models trained on Multi30k plus filler pieces),
saves it in the Hugging Face layout, imports it with `mtkit import marian` and exports it to
CTranslate2 int8. The same Multi30k test2016 English sentences then go through mtkit's PyTorch
engine, its CTranslate2 int8 export and `transformers`' `generate`, at beam 5 and greedy, each
output capped at the same fixed length (a random model rarely ends a sentence, so every system
decodes the same number of steps), the systems alternating A B C A B C. Then one fine-tuning update
(forward, backward, Adam) of mtkit's model and of transformers' on the same batch, alternating.
Every timed run is a process of its own (built, warmed up once, timed once), so what one system sets
for the process (mtkit keeps freed heap memory, for one) never reaches another.
Prints the figures and the ratios, with the matmul peak of the same run, and writes JSON.
Needs `transformers` (pip install -e '.[dev]') and ctranslate2; offline.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import io
import itertools
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sentencepiece as spm
import torch

from mtkit.decoding.ct2_engine import load_export
from mtkit.decoding.translator import Decoding, Translator
from mtkit.exporters.ctranslate2 import export_ctranslate2
from mtkit.importers.marian import import_marian
from mtkit.runtime import set_threads
from mtkit.training.loss import sequence_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  the matmul peak, measured the same way as for every benchmark

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
DECODERS = ["mtkit pytorch", "mtkit ctranslate2 int8", "transformers generate"]
OPUS_MT = {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 58101}


def lines(name: str, count: int) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in itertools.islice(handle, count)]


def sentencepiece(lang: str) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines(f"train.{lang}.gz", 29000)), model_writer=model, vocab_size=6000, minloglevel=2
    )
    return model.getvalue()


def build_opus_mt_sized(folder: Path) -> None:
    """A random Marian model of OPUS-MT's size in the Hugging Face layout (transformers' own initialisation)."""
    from transformers import MarianConfig, MarianMTModel

    source, target = sentencepiece("en"), sentencepiece("fr")
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    pieces: list[str] = ["</s>", "<unk>"]
    for proto in (source, target):
        processor = spm.SentencePieceProcessor(model_proto=proto)
        pieces += [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    pieces = list(dict.fromkeys(pieces))
    pieces += [f"▁filler{i}" for i in range(OPUS_MT["vocab"] - 1 - len(pieces))] + ["<pad>"]
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "fr"}))
    config = MarianConfig(
        vocab_size=len(pieces),
        decoder_vocab_size=len(pieces),
        d_model=OPUS_MT["d_model"],
        encoder_layers=OPUS_MT["layers"],
        decoder_layers=OPUS_MT["layers"],
        encoder_attention_heads=OPUS_MT["heads"],
        decoder_attention_heads=OPUS_MT["heads"],
        encoder_ffn_dim=OPUS_MT["ffn"],
        decoder_ffn_dim=OPUS_MT["ffn"],
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


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


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
    translator = Translator.load(scratch / "run") if name == "mtkit pytorch" else Translator.over(load_export(scratch / "ct2"))
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
    translator = Translator.load(scratch / "run")
    mt_model = translator.engine.model.train()
    mt_optimizer = torch.optim.Adam(mt_model.parameters(), lr=1e-5)
    src_ids = [translator.tokenizers.src.encode(s) + [3] for s in sources]
    tgt_ids = [translator.tokenizers.tgt.encode(t) for t in targets]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in src_ids], batch_first=True)
    tgt_in = torch.nn.utils.rnn.pad_sequence([torch.tensor([2, *t]) for t in tgt_ids], batch_first=True)
    gold = torch.nn.utils.rnn.pad_sequence([torch.tensor([*t, 3]) for t in tgt_ids], batch_first=True)

    def mtkit_update() -> None:
        loss = sequence_loss(mt_model(src, src.ne(0), tgt_in), gold, 0.1)
        loss.backward()
        mt_optimizer.step()
        mt_optimizer.zero_grad(set_to_none=True)

    return mtkit_update


def child(task: dict) -> None:
    """One timed run in a process of its own (so no system's allocator or thread settings reach another).

    The system is built, warmed up (one update, or eight sentences), timed once; the seconds go to
    stdout as JSON.
    """
    set_threads(task["threads"])
    scratch = Path(task["scratch"])
    if task["kind"] == "update":
        update = update_system(task["system"], scratch, task["sources"], task["targets"])
        update()
        print(json.dumps({"seconds": timed(update)}))
        return
    translate = decoding_system(task["system"], scratch, task["cap"], task["beam"])
    translate(task["sources"][:8])
    print(json.dumps({"seconds": timed(lambda: translate(task["sources"]))}))


def alternate(task: dict, systems: list[str], repeats: int) -> dict[str, list[float]]:
    """Seconds of each system per repeat, each run a fresh process, the systems taking turns (A B C A B C ...)."""
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name in systems:
            done = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps({**task, "system": name})],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            times[name].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=200, help="Multi30k test2016 sentences decoded")
    parser.add_argument("--cap", type=int, default=40, help="output tokens per sentence (a fixed cap for every system)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-pairs", type=int, default=32, help="sentence pairs in the fine-tuning batch")
    parser.add_argument("--threads", type=int, default=0, help="torch and CTranslate2 threads (0: all cores)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/opus_mt.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one timed run, started by alternate()
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    set_threads(args.threads)
    sources, targets = lines("test_2016_flickr.en.gz", args.sentences), lines("test_2016_flickr.fr.gz", args.sentences)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "hf").mkdir()
        build_opus_mt_sized(Path(scratch) / "hf")
        import_marian(str(Path(scratch) / "hf"), Path(scratch) / "run")
        export_ctranslate2(Path(scratch) / "run", Path(scratch) / "ct2", "int8")
        result = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine()}
        result |= {"threads": torch.get_num_threads(), "matmul_gflops": round(speed.matmul_flops_per_s() / 1e9, 1)}
        result |= {"model": OPUS_MT, "sentences": len(sources), "cap": args.cap, "repeats": args.repeats}
        task = {"scratch": scratch, "threads": args.threads, "sources": sources, "cap": args.cap}
        for beam in (5, 1):
            times = alternate({**task, "kind": "decode", "beam": beam}, DECODERS, args.repeats)
            result[f"beam{beam}_seconds"] = {name: round(statistics.median(t), 3) for name, t in times.items()}
            report(f"beam {beam}, {len(sources)} sentences x {args.cap} tokens", result[f"beam{beam}_seconds"], DECODERS[-1])
        pairs = {"sources": sources[: args.batch_pairs], "targets": targets[: args.batch_pairs]}
        times = alternate({**task, **pairs, "kind": "update"}, ["mtkit", "transformers"], args.repeats)
        result["update_seconds"] = {name: round(statistics.median(t), 3) for name, t in times.items()}
        report(f"one fine-tuning update, {args.batch_pairs} pairs", result["update_seconds"], "transformers")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"matmul peak {result['matmul_gflops']} GFLOP/s, {result['threads']} threads; written to {args.out}")


def report(title: str, seconds: dict[str, float], baseline: str) -> None:
    print(title)
    for name, value in seconds.items():
        print(f"  {name:<24} {value:8.2f} s   {seconds[baseline] / value:5.2f}x {baseline}")


if __name__ == "__main__":
    main()
