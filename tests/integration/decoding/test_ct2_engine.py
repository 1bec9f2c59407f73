"""The CTranslate2 engine's features beyond plain search: scoring, target prefixes, n-gram blocking,
sampling and word alignments, through the API and the CLI, each checked against the PyTorch engine."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.data.tokenizer import BOS_ID, EOS_ID
from mtkit.decoding.alignment import pharaoh
from mtkit.decoding.ct2_engine import MANIFEST, load_export
from mtkit.decoding.engine import output_cap
from mtkit.decoding.options import Decoding, Sampling
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError

LONG_PREFIX = " ".join("a" * 30)  # longer than the output cap of a short line
REPEATING = ["a b a b c", "c d c d c d", "e f g e f g", "g h g h i j i j", "a a a a"]  # reversed, they repeat n-grams


@pytest.fixture
def valid_lines(reverse_run) -> list[str]:
    return (reverse_run.data_path.parent / "raw/valid.src").read_text(encoding="utf-8").splitlines()[:20]


def ngrams(tokens: list[int], size: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1)]


@pytest.mark.slow
def test_scores_equal_the_pytorch_engines_per_pair_and_per_token(reverse_pytorch, reverse_ct2, valid_lines):
    sources = [*valid_lines, "a b c", "", "l k j i"]
    targets = [" ".join(reversed(line.split())) for line in sources]
    targets[:3] = ["x y z", "", "a a a a a a a a"]  # wrong, empty and repeating translations score too
    found, expected = reverse_ct2.score(sources, targets), reverse_pytorch.score(sources, targets)
    assert [s.tokens for s in found] == [s.tokens for s in expected]
    assert [s.log_prob for s in found] == pytest.approx([s.log_prob for s in expected], abs=1e-3)
    assert found[3].log_prob > -0.5 > found[0].log_prob  # a right translation scores far above a wrong one
    # Per token: the target's pieces, then the EOS; no BOS.
    source, target = reverse_pytorch.tokenizers.src.encode("a b c d"), reverse_pytorch.tokenizers.tgt.encode("d c b a")
    per_token = reverse_ct2.engine.score([source, []], [target, []])
    assert [len(log_probs) for log_probs in per_token] == [len(target) + 1, 1]
    assert per_token[0] == pytest.approx(reverse_pytorch.engine.score([source], [target])[0], abs=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_prefixed_outputs_start_with_the_prefix_and_match_pytorch(reverse_pytorch, reverse_ct2, valid_lines, beam):
    lines = [*valid_lines[:6], "a b c", "l k j i"]
    prefixes = ["", "l l", "b a", "", "k", "c c c", LONG_PREFIX, "i j"]
    prefixes += [""] * (len(lines) - len(prefixes))
    decoding = Decoding(beam=beam, nbest=min(beam, 2))
    found = reverse_ct2.translate_nbest(lines, decoding, prefixes=prefixes)
    expected = reverse_pytorch.translate_nbest(lines, decoding, prefixes=prefixes)
    assert [[t.tokens for t in best] for best in found] == [[t.tokens for t in best] for best in expected]
    for mine, theirs in zip(found, expected, strict=True):
        assert [t.score for t in mine] == pytest.approx([t.score for t in theirs], abs=1e-4)
    for best, prefix in zip(found, prefixes, strict=True):
        prefix_ids = reverse_ct2.target_prefix(prefix)
        assert all(t.tokens[: len(prefix_ids)] == prefix_ids for t in best)
    # A prefix longer than the line's cap raises the cap to its length, and no further.
    assert [t.tokens for t in found[6]] == [reverse_ct2.target_prefix(LONG_PREFIX)]
    assert found[1][0].text.startswith("l l")


@pytest.mark.parametrize(("beam", "alpha"), [(1, 1.0), (4, 1.0), (4, 0.0)])
def test_a_batch_of_many_output_caps_gives_what_each_line_gives_alone(
    reverse_pytorch, reverse_ct2, valid_lines, monkeypatch, beam, alpha
):
    """One CTranslate2 call holds sources of different caps (here half a source's length, so most outputs
    are cut): each line gives what it gives alone, at its own cap; greedy also what the PyTorch engine gives."""
    for translator in (reverse_ct2, reverse_pytorch):
        monkeypatch.setattr(translator, "decode", dataclasses.replace(translator.decode, max_len_a=0.5, max_len_b=1))
    lines = [*valid_lines, "a b c d e f g h i j k l", "a", "b c"]
    decoding = Decoding(beam=beam, nbest=min(beam, 2), length_penalty=alpha)
    together = reverse_ct2.translate_nbest(lines, decoding)
    alone = [reverse_ct2.translate_nbest([line], decoding)[0] for line in lines]
    assert [[t.tokens for t in best] for best in together] == [[t.tokens for t in best] for best in alone]
    for mine, theirs in zip(together, alone, strict=True):
        assert [t.score for t in mine] == pytest.approx([t.score for t in theirs], abs=1e-4)
    caps = [
        output_cap(len(reverse_ct2.tokenizers.src.encode(line)) + 1, reverse_ct2.decode, max_positions=1024) for line in lines
    ]
    assert sum(len(best[0].tokens) == cap for best, cap in zip(together, caps, strict=True)) >= len(lines) // 2
    if beam == 1:
        expected = reverse_pytorch.translate_nbest(lines, decoding)
        assert [best[0].tokens for best in together] == [best[0].tokens for best in expected]


def test_an_empty_line_with_a_prefix_gives_the_prefix_alone(reverse_pytorch, reverse_ct2):
    """CTranslate2 does not translate an empty source: it gives the prefix, scored as the model scores it."""
    decoding = Decoding(beam=4, nbest=2, alignments=True)
    found = reverse_ct2.translate_nbest(["", "a b c"], decoding, prefixes=["c b", "c b"])
    assert [t.text for t in found[0]] == ["c b"]
    # the line beside it is translated: its best is the reversal (a probe the fixture's margin covers) in both
    # engines; the runner-up is not compared, as no margin separates it from the third
    pytorch = reverse_pytorch.translate_nbest(["a b c"], decoding, prefixes=["c b"])[0]
    assert found[1][0].text == pytorch[0].text == "c b a" and len(found[1]) == 2
    # its score is the model's for the prefix alone (the PyTorch engine's search may go on after it: an empty source
    # is outside what the model learned), by length-normalised log-probability as the recipe's length penalty 1.0 has it
    assert reverse_pytorch.decode.length_penalty == 1.0
    forced = reverse_pytorch.score([""], ["c b"])[0]
    assert found[0][0].score == pytest.approx(forced.average, abs=1e-4) and len(found[0][0].links) == len(found[0][0].tokens)


def test_no_repeat_ngram_blocks_repeats_like_pytorch_in_greedy_search(reverse_pytorch, reverse_ct2):
    free = reverse_ct2.translate_nbest(REPEATING, Decoding(beam=1))
    assert any(len(set(ngrams(best[0].tokens, 2))) < len(ngrams(best[0].tokens, 2)) for best in free)
    for size in (1, 2, 3):
        decoding = Decoding(beam=1, no_repeat_ngram=size)
        found, expected = reverse_ct2.translate_nbest(REPEATING, decoding), reverse_pytorch.translate_nbest(REPEATING, decoding)
        assert [best[0].tokens for best in found] == [best[0].tokens for best in expected]
        assert [best[0].score for best in found] == pytest.approx([best[0].score for best in expected], abs=1e-4)
        for best in found:
            assert len(set(ngrams(best[0].tokens, size))) == len(ngrams(best[0].tokens, size))


def test_no_repeat_ngram_in_beam_search_keeps_the_models_own_scores(reverse_pytorch, reverse_ct2):
    """CTranslate2 renormalises what blocking leaves, so its beams may differ from mtkit's (see
    `mtkit.decoding.ct2_engine`); every output still blocks repeats and carries the model's own score."""
    found = reverse_ct2.translate_nbest(REPEATING, Decoding(beam=3, nbest=3, no_repeat_ngram=2, length_penalty=1.0))
    flat = [t for best in found for t in best]
    assert all(len(set(ngrams(t.tokens, 2))) == len(ngrams(t.tokens, 2)) for t in flat)
    sources = [line for line, best in zip(REPEATING, found, strict=True) for _ in best]
    scored = reverse_pytorch.score(sources, [t.text for t in flat])
    assert [t.score for t in flat] == pytest.approx([s.log_prob / s.tokens for s in scored], abs=1e-3)
    assert all([t.score for t in best] == sorted((t.score for t in best), reverse=True) for best in found)


def test_sampling_is_seeded_draws_nbest_samples_and_top_k_1_is_greedy(reverse_pytorch, reverse_ct2, valid_lines):
    lines = [*valid_lines[:8], "a b c"]
    full = Sampling(top_k=0, temperature=2.0, seed=1)  # a flat distribution: samples differ
    first = reverse_ct2.translate_nbest(lines, Decoding(sampling=full, nbest=4))
    again = reverse_ct2.translate_nbest(lines, Decoding(sampling=full, nbest=4))
    other = reverse_ct2.translate_nbest(lines, Decoding(sampling=Sampling(temperature=2.0, seed=2), nbest=4))
    texts = [[t.text for t in best] for best in first]
    assert texts == [[t.text for t in best] for best in again]
    assert texts != [[t.text for t in best] for best in other]
    widest = Decoding(sampling=Sampling(temperature=2.0, seed=2**64 - 1), nbest=4)  # CTranslate2's own seeds have 32 bits
    assert reverse_ct2.translate_nbest(lines, widest) == reverse_ct2.translate_nbest(lines, widest)
    assert [len(best) for best in first] == [4] * len(lines)
    assert any(len(set(samples)) > 1 for samples in texts)
    assert all([t.score for t in best] == sorted((t.score for t in best), reverse=True) for best in first)
    # Scores are the model's: the total log-probability over length ** alpha, as in the PyTorch engine.
    sources = [reverse_pytorch.segments(line)[0] for line in lines for _ in range(4)]
    flat = [t for best in first for t in best]
    log_probs = reverse_pytorch.engine.score(sources, [t.tokens for t in flat])
    alpha = reverse_ct2.decode.length_penalty
    assert [t.score for t in flat] == pytest.approx([sum(p) / len(p) ** alpha for p in log_probs], abs=1e-3)

    greedy = reverse_ct2.translate_nbest(lines, Decoding(beam=1))
    top_1 = Decoding(sampling=Sampling(top_k=1, seed=3), nbest=2)
    argmax, expected = reverse_ct2.translate_nbest(lines, top_1), reverse_pytorch.translate_nbest(lines, top_1)
    assert [[t.tokens for t in best] for best in argmax] == [[g[0].tokens] * 2 for g in greedy]
    assert [t.score for best in argmax for t in best] == pytest.approx([t.score for best in expected for t in best], abs=1e-4)


def test_sampling_with_a_prefix_and_top_p_keeps_the_prefix(reverse_ct2):
    found = reverse_ct2.translate_nbest(
        ["a b c d"] * 3, Decoding(sampling=Sampling(top_p=0.9, temperature=1.5, seed=5), nbest=3), prefixes=["l", "", "d c"]
    )
    assert all(t.text.startswith("l") for t in found[0]) and all(t.text.startswith("d c") for t in found[2])


def test_alignments_equal_pytorchs_and_come_from_the_last_layer_averaged_over_heads(reverse_pytorch, reverse_ct2, valid_lines):
    lines = [*valid_lines, "a b c d", "", "l k j i h g f"]
    for decoding in (Decoding(beam=1, alignments=True), Decoding(beam=2, nbest=2, alignments=True, alignment_layer=1)):
        found, expected = reverse_ct2.translate_nbest(lines, decoding), reverse_pytorch.translate_nbest(lines, decoding)
        assert [[(t.tokens, t.links, t.alignment) for t in best] for best in found] == [
            [(t.tokens, t.links, t.alignment) for t in best] for best in expected
        ]
    # the reverse task aligns anti-diagonally; attention has no margin like the outputs', so one link may stray
    assert len(set(found[-3][0].alignment) & {(3, 0), (2, 1), (1, 2), (0, 3)}) >= 3

    # The weights themselves: CTranslate2's are the last layer's, averaged over its heads (EOS column left out).
    source, target = reverse_pytorch.tokenizers.src.encode("a b c d e"), reverse_pytorch.tokenizers.tgt.encode("e d c b a")
    model = reverse_pytorch.engine.model
    result = reverse_ct2.engine.model.translate_batch(
        [reverse_ct2.tokenizers.src.id_to_piece(source)],
        target_prefix=[reverse_ct2.tokenizers.tgt.id_to_piece(target)],
        return_attention=True,
        beam_size=1,
        max_decoding_length=len(target) + 1,
    )[0]
    with torch.no_grad():
        src = torch.tensor([[*source, EOS_ID]])
        weights = model.cross_attention(
            torch.tensor([[BOS_ID, *target]]), model.encode(src, src.ne(0)), src_mask=src.ne(0), layer=-1
        )
    expected_weights = weights[0].mean(dim=0)[: len(target), : len(source)]  # (T, S)
    torch.testing.assert_close(torch.tensor(result.attention[0][: len(target)]), expected_weights, atol=1e-4, rtol=0)


def test_alignments_from_another_layer_or_an_older_export_are_one_clear_error(reverse_ct2, reverse_export, tmp_path):
    with pytest.raises(MtkitError, match=r"^--alignment-layer 0: .*last decoder layer only \(-1 or 1\); .*PyTorch engine"):
        reverse_ct2.translate_nbest(["a b"], Decoding(alignments=True, alignment_layer=0))
    older = shutil.copytree(reverse_export, tmp_path / "older")
    manifest = json.loads((older / MANIFEST).read_text())
    del manifest["alignment_layer"]
    (older / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(MtkitError, match="export it again"):
        Translator.over(load_export(older, threads=1)).translate_nbest(["a b"], Decoding(alignments=True))
    assert Translator.over(load_export(older, threads=1)).translate(["a b c"]) == ["c b a"]


def test_the_cli_translates_with_prefixes_sampling_and_alignments_and_scores(reverse_pytorch, reverse_export, tmp_path):
    source, prefix, target = tmp_path / "in.txt", tmp_path / "prefix.txt", tmp_path / "ref.txt"
    source.write_text("a b c\nl k j i\nd e\n", encoding="utf-8")
    prefix.write_text("c\n\nl\n", encoding="utf-8")
    target.write_text("c b a\ni j k l\nd e\n", encoding="utf-8")
    runner, model = CliRunner(), ["-m", str(reverse_export)]

    prefixed = runner.invoke(app, ["translate", *model, "-i", str(source), "--prefix", str(prefix)])
    assert prefixed.exit_code == 0, prefixed.stderr
    lines, prefixes = source.read_text().splitlines(), prefix.read_text().splitlines()
    expected_lines = [best[0].text for best in reverse_pytorch.translate_nbest(lines, Decoding(), prefixes=prefixes)]
    assert prefixed.stdout.splitlines() == expected_lines
    assert expected_lines[0] == "c b a" and expected_lines[2].startswith("l")

    sampling = ["translate", *model, "-i", str(source), "--sampling", "topk:5", "--seed", "1", "--nbest", "2"]
    sampled = [runner.invoke(app, sampling) for _ in range(2)]
    assert sampled[0].exit_code == 0, sampled[0].stderr
    assert sampled[0].stdout == sampled[1].stdout
    assert [len(line.split("\t")) for line in sampled[0].stdout.splitlines()] == [4, 4, 4]  # 2 x (text, score)

    aligned = runner.invoke(app, ["translate", *model, "-i", str(source), "--alignments"])
    assert aligned.exit_code == 0, aligned.stderr
    expected_alignments = reverse_pytorch.translate_nbest(lines, Decoding(alignments=True))
    assert aligned.stdout.splitlines() == [f"{best[0].text}\t{pharaoh(best[0].alignment)}" for best in expected_alignments]
    text, pairs = aligned.stdout.splitlines()[0].split("\t")  # which source word each attends to most is the model's own
    assert text == "c b a" and sorted(int(pair.split("-")[1]) for pair in pairs.split()) == [0, 1, 2]
    refused = runner.invoke(app, ["translate", *model, "-i", str(source), "--alignments", "--alignment-layer", "0"])
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1 and "PyTorch engine" in refused.stderr

    scored = runner.invoke(app, ["score", *model, "--src", str(source), "--tgt", str(target)])
    assert scored.exit_code == 0, scored.stderr
    totals = [float(line.split("\t")[0]) for line in scored.stdout.splitlines()]
    expected = reverse_pytorch.score(lines, target.read_text().splitlines())
    assert totals == pytest.approx([s.log_prob for s in expected], abs=1e-3)
