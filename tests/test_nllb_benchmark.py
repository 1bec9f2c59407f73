"""benchmarks/nllb.py's SentencePiece model at NLLB's size: learned on Multi30k, then filled with pieces no text
reaches, so the ids and the output layer have the real model's size while text is cut as the learned model cuts it
(the whole benchmark runs in its smoke mode in tests/system/test_benchmarks.py)."""

from __future__ import annotations

import sentencepiece as spm

from benchmarks.common import SMOKE_SOURCE, first_lines
from benchmarks.nllb import SMOKE_SHAPE, filled_sentencepiece


def test_the_filled_model_has_the_size_asked_and_text_never_reaches_a_filler_piece() -> None:
    shape = {**SMOKE_SHAPE, "pieces": 1000}
    processor = spm.SentencePieceProcessor(model_proto=filled_sentencepiece(SMOKE_SOURCE, shape))
    assert processor.get_piece_size() == 1000
    learned = shape["spm_vocab"]
    fillers = [processor.id_to_piece(index) for index in range(learned, 1000)]
    assert all(piece.startswith("⁂") for piece in fillers) and len(set(fillers)) == len(fillers)
    scores = [processor.get_score(index) for index in range(learned - 1, 1000)]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    lines = first_lines(SMOKE_SOURCE / "test_2016_flickr.de.gz", 50) + first_lines(SMOKE_SOURCE / "train.en.gz", 50)
    ids = [index for line in lines for index in processor.encode(line)]
    assert ids and max(ids) < learned
