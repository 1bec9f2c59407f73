"""Decoder features end to end (scoring, prefixes, sampling, n-gram blocking, ensembles, alignments)
on reverse-task models of both architectures, through the Python API and the CLI."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.constraints import Sampling
from mtkit.errors import MtkitError
from mtkit.tokenizer import BOS_ID, EOS_ID
from mtkit.translate import Decoding, Translator

ARCHITECTURES = ["reverse_run", "reverse_rnn_run"]


@pytest.fixture(params=ARCHITECTURES, scope="module")
def run(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def translator(run) -> Translator:
    return Translator.load(run.run_path, device="cpu")


@pytest.fixture(scope="module")
def valid(run) -> tuple[list[str], list[str]]:
    raw = run.data_path.parent / "raw"
    return (raw / "valid.src").read_text().splitlines(), (raw / "valid.tgt").read_text().splitlines()


def cli(*arguments: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in arguments])
    assert result.exit_code == 0, result.output
    return result.stdout


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@torch.inference_mode()
def forward_log_prob(translator: Translator, source: str, target: str) -> float:
    """The sum of teacher-forced log-probabilities from the model's forward, one pair alone."""
    model = translator.engine.model
    src = torch.tensor([[*translator.tokenizers.src.encode(source), EOS_ID]])
    gold = translator.tokenizers.tgt.encode(target) + [EOS_ID]
    log_probs = model(src, src.bool(), torch.tensor([[BOS_ID, *gold[:-1]]])).log_softmax(-1)[0]  # (T, V)
    return float(sum(log_probs[t, token] for t, token in enumerate(gold)))


def test_scores_are_the_teacher_forced_log_probabilities_of_the_forward(translator, valid):
    sources, targets = valid[0][:12], valid[1][:12]
    targets[3] = ""  # only the EOS is scored
    scores = translator.score(sources, targets)
    for source, target, score in zip(sources, targets, scores, strict=True):
        assert score.log_prob == pytest.approx(forward_log_prob(translator, source, target), abs=1e-4)
        assert score.tokens == len(translator.tokenizers.tgt.encode(target)) + 1
        assert score.average == pytest.approx(score.log_prob / score.tokens)


def test_the_models_own_translations_score_higher_than_shuffled_references(translator, valid):
    sources = valid[0][:40]
    own = translator.translate(sources, beam=4)
    shuffled = valid[1][:40]
    random.Random(0).shuffle(shuffled)
    mean = [sum(s.average for s in translator.score(sources, targets)) / 40 for targets in (own, shuffled)]
    assert mean[0] > mean[1] + 1.0


def test_score_cli_prints_tab_separated_or_json_lines_in_input_order(run, translator, valid, tmp_path):
    src, tgt = write(tmp_path / "src", valid[0][:9]), write(tmp_path / "tgt", valid[1][:9])
    expected = translator.score(valid[0][:9], valid[1][:9])
    rows = [line.split("\t") for line in cli("score", "-m", run.run_path, "--src", src, "--tgt", tgt).splitlines()]
    assert [float(row[0]) for row in rows] == pytest.approx([s.log_prob for s in expected], abs=1e-3)
    assert [int(row[2]) for row in rows] == [s.tokens for s in expected]
    cli("score", "-m", run.run_path, "--src", src, "--tgt", tgt, "--json", "-o", tmp_path / "scores.jsonl")
    records = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in records] == [s.tokens for s in expected]
    assert records[0]["average"] == pytest.approx(expected[0].average, abs=1e-5)


def test_score_cli_refuses_files_of_different_lengths(run, valid, tmp_path):
    src, tgt = write(tmp_path / "src", valid[0][:5]), write(tmp_path / "tgt", valid[1][:4])
    result = CliRunner().invoke(app, ["score", "-m", str(run.run_path), "--src", str(src), "--tgt", str(tgt)])
    assert result.exit_code == 2
    assert f"{src} has 5 lines but {tgt} has 4" in result.output


@pytest.mark.parametrize("beam", [1, 3])
def test_outputs_start_with_their_prefix_and_an_empty_prefix_changes_nothing(translator, valid, beam):
    sources = valid[0][:10]
    prefixes = ["k l" if n % 2 == 0 else "" for n in range(10)]
    plain = translator.translate_nbest(sources, Decoding(beam=beam))
    prefixed = translator.translate_nbest(sources, Decoding(beam=beam), prefixes)
    prefix_ids = translator.tokenizers.tgt.encode("k l")
    for n, (before, after) in enumerate(zip(plain, prefixed, strict=True)):
        if prefixes[n]:
            assert after[0].tokens[: len(prefix_ids)] == prefix_ids and after[0].text.startswith("k l")
        else:
            assert after[0].tokens == before[0].tokens and after[0].score == pytest.approx(before[0].score, abs=1e-5)


def test_prefix_cli_and_its_line_count_check(run, valid, tmp_path):
    source = write(tmp_path / "src", valid[0][:4])
    prefix = write(tmp_path / "prefix", ["a", "", "b c", ""])
    lines = cli("translate", "-m", run.run_path, "-i", source, "--prefix", prefix).splitlines()
    assert lines[0].startswith("a") and lines[2].startswith("b c")
    assert lines[1] == cli("translate", "-m", run.run_path, "-i", write(tmp_path / "one", [valid[0][1]])).strip()
    short = write(tmp_path / "short", ["a"])
    result = CliRunner().invoke(app, ["translate", "-m", str(run.run_path), "-i", str(source), "--prefix", str(short)])
    assert result.exit_code == 2 and "has 1 lines but" in result.output


def test_sampling_draws_nbest_samples_and_the_same_seed_draws_the_same(translator, valid):
    sources = valid[0][:8]
    decoding = Decoding(nbest=5, sampling=Sampling(top_k=0, temperature=3.0, seed=5))
    first, again = translator.translate_nbest(sources, decoding), translator.translate_nbest(sources, decoding)
    assert all(len(samples) == 5 for samples in first)
    assert [[t.tokens for t in s] for s in first] == [[t.tokens for t in s] for s in again]
    assert len({tuple(t.tokens) for samples in first for t in samples}) > 8  # hot samples differ
    greedy = translator.translate_nbest(sources, Decoding(beam=1))
    top1 = translator.translate_nbest(sources, Decoding(sampling=Sampling(top_k=1, seed=1)))
    assert [s[0].tokens for s in top1] == [g[0].tokens for g in greedy]
    with pytest.raises(MtkitError, match="--beam 4 with --sampling"):
        translator.translate_nbest(sources, Decoding(beam=4, sampling=Sampling()))


def test_sampling_cli_is_reproducible_by_seed(run, valid, tmp_path):
    source = write(tmp_path / "src", valid[0][:6])
    arguments = ["translate", "-m", run.run_path, "-i", source, "--sampling", "topp:0.9", "--temperature", "2", "--nbest", "3"]
    first, again = cli(*arguments, "--seed", "1"), cli(*arguments, "--seed", "1")
    assert first == again and len(first.splitlines()) == 6
    assert all(len(line.split("\t")) == 6 for line in first.splitlines())  # 3 samples and their scores
    bad = CliRunner().invoke(app, ["translate", "-m", str(run.run_path), "-i", str(source), "--sampling", "top5"])
    assert bad.exit_code == 2 and "--sampling top5: give topk:K" in bad.output


def test_no_repeat_ngram_leaves_no_repeated_ngram(run, translator, tmp_path):
    sources = ["a a a b a a a b", "c c c c c c", "a b a b a b a b"]
    for beam in (1, 3):
        for found in translator.translate_nbest(sources, Decoding(beam=beam, no_repeat_ngram=2)):
            pieces = found[0].tokens
            bigrams = Counter(zip(pieces, pieces[1:], strict=False))
            assert all(count == 1 for count in bigrams.values())
    lines = cli("translate", "-m", run.run_path, "-i", write(tmp_path / "src", sources), "--no-repeat-ngram", "1").splitlines()
    assert all(len(line.split()) == len(set(line.split())) for line in lines)


def test_an_ensemble_of_a_model_with_itself_gives_its_outputs_and_scores(run, translator, valid):
    ensemble = Translator.load([run.run_path, run.run_path], device="cpu")
    sources, targets = valid[0][:15], valid[1][:15]
    for beam in (1, 3):
        alone, both = (
            translator.translate_nbest(sources, Decoding(beam=beam)),
            ensemble.translate_nbest(sources, Decoding(beam=beam)),
        )
        assert [t[0].tokens for t in both] == [t[0].tokens for t in alone]
        assert [t[0].score for t in both] == pytest.approx([t[0].score for t in alone], abs=1e-4)
    assert [s.log_prob for s in ensemble.score(sources, targets)] == pytest.approx(
        [s.log_prob for s in translator.score(sources, targets)], abs=1e-4
    )


def test_a_transformer_and_an_rnn_ensemble_through_the_cli(reverse_run, reverse_rnn_run, tmp_path):
    raw = reverse_run.data_path.parent / "raw"
    sources, targets = (raw / "valid.src").read_text().splitlines()[:20], (raw / "valid.tgt").read_text().splitlines()[:20]
    source = write(tmp_path / "src", sources)
    models = ["-m", reverse_run.run_path, "-m", reverse_rnn_run.run_path]
    lines = cli("translate", *models, "-i", source).splitlines()
    assert sum(line == target for line, target in zip(lines, targets, strict=True)) >= 18
    assert len(cli("score", *models, "--src", source, "--tgt", write(tmp_path / "tgt", targets)).splitlines()) == 20
    result = json.loads(cli("evaluate", *models, "--src", source, "--ref", tmp_path / "tgt", "--json"))
    assert result["scores"]["BLEU"]["score"] > 80


def test_alignments_on_the_reverse_task_are_anti_diagonal(translator, valid):
    sources = valid[0][:30]
    found = translator.translate_nbest(sources, Decoding(beam=2, alignments=True))
    on_diagonal = total = 0
    for source, [best] in zip(sources, found, strict=True):
        words = len(source.split())
        assert best.alignment and all(0 <= i < words and 0 <= j < len(best.text.split()) for i, j in best.alignment)
        on_diagonal += sum(i == words - 1 - j for i, j in best.alignment)
        total += len(best.alignment)
    assert on_diagonal >= 0.9 * total


def test_alignments_cli_appends_pharaoh_pairs_after_a_tab(run, valid, tmp_path):
    source = write(tmp_path / "src", valid[0][:5] + [""])
    lines = cli("translate", "-m", run.run_path, "-i", source, "--alignments").splitlines()
    assert len(lines) == 6 and lines[5] == "\t"
    for line, text in zip(lines, valid[0][:5], strict=False):
        translation, pairs = line.split("\t")
        assert translation == " ".join(reversed(text.split()))
        assert all(pair.count("-") == 1 and all(part.isdigit() for part in pair.split("-")) for pair in pairs.split())
    layer = CliRunner().invoke(
        app, ["translate", "-m", str(run.run_path), "-i", str(source), "--alignments", "--alignment-layer", "7"]
    )
    assert layer.exit_code == 2 and "--alignment-layer 7" in layer.output


def test_an_ensemble_of_models_with_other_vocabularies_is_one_clear_error(reverse_run, tmp_path):
    from mtkit.models.ensemble import check_same_vocabularies
    from mtkit.tokenizer import TokenizerPair, load_tokenizers, train_sentencepiece

    pair = load_tokenizers(reverse_run.data_path, reverse_run.tokenizer.joint)
    other_words = ["m n o p q r s t u v w x y z", "mn op qr st uv wx yz"] * 50  # not the task's letters
    other = TokenizerPair.of(pair.src, train_sentencepiece(other_words, 30))
    check_same_vocabularies([Path("a"), Path("b")], [pair, pair])  # the same vocabularies pass
    with pytest.raises(MtkitError, match="b: its target vocabulary differs from a's"):
        check_same_vocabularies([Path("a"), Path("b")], [pair, other])


def test_an_ensemble_with_an_export_names_the_pytorch_engine(reverse_run, tmp_path):
    from mtkit.export import export_ctranslate2

    exported = export_ctranslate2(reverse_run.run_path, tmp_path / "export", None)
    source = write(tmp_path / "src", ["a b c"])
    result = CliRunner().invoke(app, ["translate", "-m", str(reverse_run.run_path), "-m", str(exported), "-i", str(source)])
    assert result.exit_code == 2 and "ensembles need the PyTorch engine" in result.output
