"""The peak memory of `mtkit import` of a model of NLLB-200-distilled-600M's shape, against its safetensors file.

    python -m benchmarks.import_memory [--scratch DIR] [--out benchmarks/results/import_memory.json] [--smoke]

Writes a folder of NLLB-600M's layout without transformers: model.safetensors holding random fp32 tensors of the
real shapes (d_model 1024, 12+12 layers, 16 heads, FFN 4096, a tied embedding of 256,206 rows: 2.46 GB), written
with the `safetensors` library; a SentencePiece model learned on the tests' Multi30k slice and filled to 256,000
pieces; tokenizer.json in fairseq's id layout with 202 language codes and <mask>; config.json. Then imports it
(`mtkit.importers.import_model`, as `mtkit import auto` does) in a process of its own, and reports the seconds, the
process's peak resident memory, its baseline once torch and mtkit are imported, and both against the file's size.
The folder is a temporary one (or --scratch), removed at the end. `--smoke`: a tiny model of the same layout
(d_model 16, one layer a side, a few hundred pieces), imported in this process, in seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common, turns
from benchmarks.nllb import filled_sentencepiece

NLLB_600M = {"d_model": 1024, "layers": 12, "heads": 16, "ffn": 4096, "pieces": 256000, "spm_lines": 3000, "spm_vocab": 1000}
SMOKE_SHAPE = {"d_model": 16, "layers": 1, "heads": 2, "ffn": 32, "pieces": 400, "spm_lines": 300, "spm_vocab": 200}
CODES = 202  # NLLB-200's language codes, here made up in its form (xxx_Latn)
ROWS_PAST_TOKENIZER = 2  # NLLB's config.json: vocab_size 256,206 for the tokenizer's 256,204 ids
LAYER = {  # a layer's tensors (transformers' names) and their shapes in (d_model, ffn)
    "self_attn.q_proj": "dd", "self_attn.k_proj": "dd", "self_attn.v_proj": "dd", "self_attn.out_proj": "dd",
    "self_attn_layer_norm": "d", "fc1": "fd", "fc2": "df", "final_layer_norm": "d",
}  # fmt: skip
CROSS = {"encoder_attn.q_proj": "dd", "encoder_attn.k_proj": "dd", "encoder_attn.v_proj": "dd", "encoder_attn.out_proj": "dd"}
CROSS |= {"encoder_attn_layer_norm": "d"}


def tokenizer_table(proto: bytes) -> list[str]:
    """fairseq's table of NLLB's layout: <s> <pad> </s> <unk>, the SentencePiece pieces after its own three
    specials (fairseq id = SentencePiece id + 1), the language codes, <mask>."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=proto)
    pieces = [processor.id_to_piece(index) for index in range(3, processor.get_piece_size())]
    codes = ["eng_Latn", "deu_Latn", *(f"{chr(97 + i // 26 % 26)}{chr(97 + i % 26)}q_Latn" for i in range(CODES - 2))]
    return ["<s>", "<pad>", "</s>", "<unk>", *pieces, *codes, "<mask>"]


def tensor_shapes(shape: dict, vocab_size: int) -> dict[str, list[int]]:
    """Every tensor of an M2M100ForConditionalGeneration of `shape`, as its safetensors file names them."""
    sizes = {"d": shape["d_model"], "f": shape["ffn"]}
    shapes = {"model.shared.weight": [vocab_size, shape["d_model"]]}
    for stack, parts in (("encoder", LAYER), ("decoder", LAYER | CROSS)):
        shapes |= {f"model.{stack}.layer_norm.{part}": [shape["d_model"]] for part in ("weight", "bias")}
        for index in range(shape["layers"]):
            for name, dims in parts.items():
                prefix = f"model.{stack}.layers.{index}.{name}"
                shapes[f"{prefix}.weight"] = [sizes[dim] for dim in dims]
                shapes[f"{prefix}.bias"] = [sizes[dims[0]]]
    return shapes


def write_folder(folder: Path, shape: dict) -> int:
    """The NLLB-shaped folder (random fp32 weights of the real shapes, written with safetensors); the file's size."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    proto = filled_sentencepiece(common.SMOKE_SOURCE, shape)
    (folder / "sentencepiece.bpe.model").write_bytes(proto)
    table = tokenizer_table(proto)
    first_added = len(table) - CODES - 1
    vocab = {piece: index for index, piece in enumerate(table[:first_added])}
    added = [{"id": index, "content": piece} for index, piece in enumerate(table) if index >= first_added]
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": added}), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"src_lang": "deu_Latn"}), encoding="utf-8")
    vocab_size = len(table) + ROWS_PAST_TOKENIZER
    config = {"model_type": "m2m_100", "vocab_size": vocab_size, **common.transformers_shape(shape)}
    config |= {"max_position_embeddings": 1024, "scale_embedding": True, "activation_function": "relu", "dropout": 0.1}
    config |= {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    generator = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(dims, generator=generator) * 0.02 for name, dims in tensor_shapes(shape, vocab_size).items()}
    save_file(tensors, folder / "model.safetensors")
    return (folder / "model.safetensors").stat().st_size


def resident_mb(field: str) -> float:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM), in MB. Not getrusage's ru_maxrss: a process
    started by another keeps the larger of its own peak and its parent's memory when it was started."""
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    return turns.peak_rss_mb()  # not Linux


def child(task: dict) -> dict:
    """Import the folder, as `mtkit import auto` does; this process's resident memory when it begins (torch and mtkit
    imported) and its peak (MB)."""
    from mtkit.importers import import_model

    baseline = resident_mb("VmRSS")
    start = time.perf_counter()
    import_model(task["folder"], Path(task["run"]))
    return {"seconds": round(time.perf_counter() - start, 2), "baseline_mb": baseline, "peak_mb": resident_mb("VmHWM")}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=Path, help="where the folder and the run are written (default: a temporary folder)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/import_memory.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the import, started by run_benchmark
    common.add_smoke_options(parser)
    args = parser.parse_args()
    args.shape = NLLB_600M
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    args.shape, args.scratch = SMOKE_SHAPE, work / "import_memory"


def run_benchmark(args: argparse.Namespace) -> dict:
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="mtkit-import-memory-"))
    shutil.rmtree(scratch / "run", ignore_errors=True)
    try:
        start = time.perf_counter()
        size = write_folder(scratch / "hf", args.shape)
        built = round(time.perf_counter() - start, 1)
        task = {"folder": str(scratch / "hf"), "run": str(scratch / "run")}
        measured = child(task) if args.smoke else turns.in_own_process("benchmarks.import_memory", task)
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    file_mb = round(size / 2**20, 1)
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat()}
    result |= {"machine": platform.processor() or platform.machine(), **common.machine_facts(), "shape": args.shape}
    result |= {"safetensors_mb": file_mb, "write_seconds": built, "import": measured}
    result["peak_over_file"] = round(measured["peak_mb"] / file_mb, 2)
    result["growth_over_file"] = round((measured["peak_mb"] - measured["baseline_mb"]) / file_mb, 2)
    print(f"model.safetensors: {file_mb} MB, written in {built} s")
    print(f"import: {measured['seconds']} s; peak {measured['peak_mb']} MB ({result['peak_over_file']}x the file), ", end="")
    print(f"{measured['baseline_mb']} MB of it before the import began ({result['growth_over_file']}x the file above it)")
    return result


def main() -> None:
    args = parse_args()
    if args.child:
        turns.answer_child(child, args.child)
        return
    common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
