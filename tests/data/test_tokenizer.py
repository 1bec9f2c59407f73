"""Tests for mtkit.data.tokenizer: SentencePiece training with fixed special ids, encode/decode, save/load."""

from __future__ import annotations

import pytest
import sentencepiece as spm
from helpers import reverse_task_config, write_multi30k_slice, write_reverse_task

from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_sentencepiece
from mtkit.errors import MtkitError

VOCAB_SIZE = 300
TRAIN_LINES = 1000


@pytest.fixture(scope="module")
def sentences(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The first 1000 German and English training sentences of Multi30k."""
    folder = tmp_path_factory.mktemp("multi30k")
    lines = []
    for lang in ("de", "en"):
        lines += (
            write_multi30k_slice(folder / f"train.{lang}", "train", lang, TRAIN_LINES).read_text(encoding="utf-8").splitlines()
        )
    return lines


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tokenizer(request: pytest.FixtureRequest, sentences: list[str]) -> Tokenizer:
    """Trained once for the module: no test changes it."""
    return train_sentencepiece(sentences, VOCAB_SIZE, model_type=request.param)


def processor(tokenizer: Tokenizer) -> spm.SentencePieceProcessor:
    """A SentencePiece processor read from the tokenizer's serialized model, independent of the wrapper."""
    return spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)


def test_bpe_and_unigram_give_different_models(sentences):
    bpe = train_sentencepiece(sentences, VOCAB_SIZE, model_type="bpe")
    unigram = train_sentencepiece(sentences, VOCAB_SIZE, model_type="unigram")
    sentence = "Zwei junge Männer spielen Fußball."
    assert bpe.model_proto != unigram.model_proto
    assert bpe.decode(bpe.encode(sentence)) == unigram.decode(unigram.encode(sentence)) == sentence


def test_special_ids_are_the_ones_the_model_defines(tokenizer):
    sp = processor(tokenizer)
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tokenizer.id_to_piece([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == [
        sp.id_to_piece(PAD_ID),
        sp.id_to_piece(UNK_ID),
        sp.id_to_piece(BOS_ID),
        sp.id_to_piece(EOS_ID),
    ]
    assert tokenizer.id_to_piece([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == ["<pad>", "<unk>", "<s>", "</s>"]
    for special in (PAD_ID, BOS_ID, EOS_ID):
        assert sp.is_control(special)
    assert sp.is_unknown(UNK_ID)


def test_vocabulary_size_is_near_the_request(tokenizer):
    # hard_vocab_limit=False lets SentencePiece stop below the request on small corpora.
    assert 100 < tokenizer.vocab_size <= VOCAB_SIZE
    assert tokenizer.vocab_size == processor(tokenizer).get_piece_size()


def test_encode_gives_no_specials_and_decode_restores_the_text(tokenizer, sentences):
    for sentence in (sentences[0], sentences[TRAIN_LINES], "Ein Hund läuft über die Wiese."):
        ids = tokenizer.encode(sentence)
        assert ids, sentence
        assert all(i > EOS_ID for i in ids), "encode adds no PAD/UNK/BOS/EOS to text the model covers"
        assert tokenizer.decode(ids) == sentence
        assert "".join(tokenizer.pieces(sentence)).replace("\u2581", " ").strip() == sentence


def test_encode_batch_equals_encoding_one_by_one(tokenizer, sentences):
    batch = sentences[:20]
    assert tokenizer.encode_batch(batch) == [tokenizer.encode(s) for s in batch]


def test_decode_drops_special_ids(tokenizer):
    ids = tokenizer.encode("Zwei Männer stehen im Freien.")
    with_specials = [BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]
    assert tokenizer.decode(with_specials) == tokenizer.decode(ids) == "Zwei Männer stehen im Freien."
    assert tokenizer.decode([BOS_ID, EOS_ID, PAD_ID]) == ""


def test_decode_accepts_any_int_sequence(tokenizer):
    import torch

    ids = tokenizer.encode("A dog runs.")
    assert tokenizer.decode(torch.tensor([BOS_ID, *ids, EOS_ID])) == "A dog runs."


def test_save_and_load_give_identical_ids(tokenizer, sentences, tmp_path):
    path = tmp_path / "spm.model"
    tokenizer.save(path)
    loaded = Tokenizer.load(path)
    assert loaded.model_proto == tokenizer.model_proto
    assert loaded.vocab_size == tokenizer.vocab_size
    sample = sentences[:50] + sentences[TRAIN_LINES : TRAIN_LINES + 50]
    assert loaded.encode_batch(sample) == tokenizer.encode_batch(sample)
    # The saved file is an ordinary SentencePiece model.
    assert spm.SentencePieceProcessor(model_file=str(path)).encode(sample[0]) == tokenizer.encode(sample[0])


def test_training_is_deterministic(sentences):
    first = train_sentencepiece(sentences, VOCAB_SIZE, model_type="bpe", seed=1)
    second = train_sentencepiece(sentences, VOCAB_SIZE, model_type="bpe", seed=1)
    assert first.model_proto == second.model_proto


def test_max_sentences_samples_the_training_text(sentences):
    small = train_sentencepiece(sentences, 150, max_sentences=200)
    assert small.vocab_size <= 150
    assert small.decode(small.encode("A man.")) == "A man."


def test_max_sentences_of_100_or_fewer_works(sentences):
    assert train_sentencepiece(sentences, 100, max_sentences=50).vocab_size <= 100


def test_reservoir_sample_is_seeded_uniform_and_reads_a_stream_once():
    from collections import Counter

    from mtkit.data.tokenizer import reservoir_sample

    def stream():  # a generator: it can be read only once, and never as a whole
        yield from (f"s{i}" for i in range(1000))
        yield "   "  # blank lines are never sampled

    assert reservoir_sample(stream(), 50, seed=3) == reservoir_sample(stream(), 50, seed=3)
    assert reservoir_sample(stream(), 50, seed=3) != reservoir_sample(stream(), 50, seed=4)
    assert sorted(reservoir_sample(iter(["a", " ", "b"]), 10, seed=1)) == ["a", "b"]
    # Each of the 1,000 items is drawn with probability 1/10: over 400 draws of 100, the
    # first and the last hundred items are drawn about equally often (4,000 expected each).
    counts = Counter(int(item[1:]) // 100 for seed in range(400) for item in reservoir_sample(stream(), 100, seed=seed))
    assert all(3600 < counts[block] < 4400 for block in range(10)), counts


def test_tokenizer_training_streams_the_corpus_and_holds_only_the_sample(tmp_path, monkeypatch):
    """`mtkit tokenizer train` hands SentencePiece a sample of tokenizer.max_sentences, read from a stream."""
    from mtkit.data import tokenizer
    from mtkit.data.prepare import train_tokenizers

    write_reverse_task(tmp_path / "raw", train_pairs=3000)
    config = reverse_task_config(tmp_path)
    config.tokenizer.max_sentences = 500
    seen = {}
    real = tokenizer.spm.SentencePieceTrainer.train

    def recording(**kwargs):
        seen["sentences"] = list(kwargs["sentence_iterator"])
        return real(**{**kwargs, "sentence_iterator": iter(seen["sentences"])})

    monkeypatch.setattr(tokenizer.spm.SentencePieceTrainer, "train", recording)
    train_tokenizers(config)
    assert len(seen["sentences"]) == 500  # joint: 500 of the 6,000 source and target sentences
    assert {len(s.split()) for s in seen["sentences"]} <= set(range(3, 8))


def test_load_missing_file_is_an_error(tmp_path):
    missing = tmp_path / "nothing.model"
    with pytest.raises(MtkitError, match="tokenizer model not found") as caught:
        Tokenizer.load(missing)
    assert str(missing) in str(caught.value)


@pytest.mark.parametrize("text", [[], ["", "   ", "\t"]])
def test_empty_training_text_is_an_error(text):
    with pytest.raises(MtkitError, match="training text is empty"):
        train_sentencepiece(text, VOCAB_SIZE)


def test_too_small_vocabulary_is_a_one_line_error(sentences):
    # Fewer pieces than the distinct characters of the text: SentencePiece refuses even with a soft limit.
    with pytest.raises(MtkitError, match="Vocabulary size is smaller than required_chars") as caught:
        train_sentencepiece(sentences, 10)
    assert "\n" not in str(caught.value)


def test_decode_keeps_unknown_tokens_visible(tokenizer):
    ids = tokenizer.encode("a dog")
    assert tokenizer.decode([UNK_ID, *ids]) != tokenizer.decode(ids)
