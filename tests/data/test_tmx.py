"""TMX translation memories as a corpus: the recipe's two languages picked from each unit (by language subtag),
inline codes left out, a memory that is not well-formed named with its line and column, and `prepare` reading one."""

from __future__ import annotations

import gzip
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
from helpers import multi30k_recipe

from mtkit.config import SplitConfig, TrainSource
from mtkit.data.corpora import iter_split
from mtkit.data.prepare import prepare_corpus, train_tokenizers
from mtkit.data.store import load_prepared
from mtkit.errors import MtkitError

MEMORY = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE tmx SYSTEM "tmx14.dtd">
<tmx version="1.4">
  <header creationtool="test" creationtoolversion="1" segtype="sentence" o-tmf="none" adminlang="en"
          srclang="de-DE" datatype="plaintext"/>
  <body>
    <tu tuid="1">
      <prop type="x-note">a note</prop>
      <tuv xml:lang="de-DE"><seg>Ein <bpt i="1">&lt;b&gt;</bpt>Hund<ept i="1">&lt;/b&gt;</ept> läuft.</seg></tuv>
      <tuv xml:lang="en-GB"><seg>A <bpt i="1">&lt;b&gt;</bpt>dog<ept i="1">&lt;/b&gt;</ept> runs.</seg></tuv>
    </tu>
    <tu tuid="2">
      <tuv xml:lang="fr-FR"><seg>Un chat.</seg></tuv>
      <tuv xml:lang="en-GB"><seg>A cat.</seg></tuv>
    </tu>
    <tu tuid="3">
      <tuv lang="EN-US"><seg>Two <hi type="b">men</hi>   laugh.<ph x="1">&lt;br/&gt;</ph></seg></tuv>
      <tuv lang="DE"><seg>Zwei Männer lachen.</seg></tuv>
    </tu>
  </body>
</tmx>
"""


def write_memory(path: Path, text: str) -> Path:
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("name", ["memory.tmx", "memory.tmx.gz"])
def test_each_unit_with_both_languages_is_a_pair_without_its_inline_codes(tmp_path: Path, name: str) -> None:
    split = SplitConfig(tmx=str(write_memory(tmp_path / name, MEMORY)))
    assert list(iter_split(split, "de", tgt_lang="en")) == [
        ("Ein Hund läuft.", "A dog runs."),
        ("Zwei Männer lachen.", "Two men laugh."),
    ]
    assert list(iter_split(split, "en", tgt_lang="fr")) == [("A cat.", "Un chat.")]
    assert list(iter_split(dataclass_with_limit(split), "de", tgt_lang="en")) == [("Ein Hund läuft.", "A dog runs.")]


def dataclass_with_limit(split: SplitConfig) -> SplitConfig:
    return SplitConfig(tmx=split.tmx, limit=1)


def test_an_exact_code_comes_before_one_that_only_shares_the_language(tmp_path: Path) -> None:
    unit = '<tu><tuv xml:lang="pt-BR"><seg>ônibus</seg></tuv><tuv xml:lang="pt-PT"><seg>autocarro</seg></tuv>' \
           '<tuv xml:lang="en"><seg>bus</seg></tuv></tu>'  # fmt: skip
    split = SplitConfig(tmx=str(write_memory(tmp_path / "m.tmx", f"<tmx><body>{unit}</body></tmx>")))
    assert list(iter_split(split, "en", tgt_lang="pt-PT")) == [("bus", "autocarro")]
    assert list(iter_split(split, "en", tgt_lang="pt")) == [("bus", "ônibus")]


def test_a_memory_that_is_not_well_formed_is_one_line_naming_its_line_and_column(tmp_path: Path) -> None:
    broken = MEMORY.replace("<seg>A cat.</seg>", "<seg>A cat.</sg>")
    split = SplitConfig(tmx=str(write_memory(tmp_path / "broken.tmx", broken)))
    with pytest.raises(MtkitError) as error:
        list(iter_split(split, "de", tgt_lang="en"))
    line = next(number for number, text in enumerate(broken.splitlines(), start=1) if "</sg>" in text)
    message = str(error.value)
    assert message.startswith(f"{split.tmx}:{line}:") and "not well-formed TMX" in message and "\n" not in message


def test_a_memory_without_the_recipes_languages_names_the_ones_it_has(tmp_path: Path) -> None:
    split = SplitConfig(tmx=str(write_memory(tmp_path / "m.tmx", MEMORY)))
    with pytest.raises(MtkitError, match=r"no translation unit has segments in both de and fr .*de, de-de, en-gb, en-us, fr-fr"):
        list(iter_split(split, "de", tgt_lang="fr"))


def test_an_entity_from_outside_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET", encoding="utf-8")
    memory = (
        f'<?xml version="1.0"?><!DOCTYPE tmx [<!ENTITY leak SYSTEM "file://{secret}">]>'
        '<tmx><body><tu><tuv xml:lang="de"><seg>a &leak;</seg></tuv><tuv xml:lang="en"><seg>b</seg></tuv></tu></body></tmx>'
    )
    split = SplitConfig(tmx=str(write_memory(tmp_path / "m.tmx", memory)))
    assert "SECRET" not in str(list(iter_split(split, "de", tgt_lang="en")))


def test_prepare_reads_a_translation_memory_as_a_training_corpus(tmp_path: Path, multi30k_slice) -> None:
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    train = config.data.train[0]
    with open(train.src, encoding="utf-8") as sources, open(train.tgt, encoding="utf-8") as targets:
        pairs = [(src.strip(), tgt.strip()) for src, tgt in zip(sources, targets, strict=True)]
    units = "".join(
        f'<tu><tuv xml:lang="de-DE"><seg>{escape(src)}</seg></tuv><tuv xml:lang="en-US"><seg>{escape(tgt)}</seg></tuv></tu>'
        for src, tgt in pairs
    )
    memory = write_memory(tmp_path / "train.tmx", f'<?xml version="1.0"?><tmx version="1.4"><body>{units}</body></tmx>')
    config.data.train = [TrainSource(tmx=str(memory))]
    train_tokenizers(config)
    report = prepare_corpus(config)
    prepared = load_prepared(config.data_path, "train")[:]
    assert report["splits"]["train"]["pairs"] == len(prepared["src"]) > 900
    assert set(zip(prepared["src"], prepared["tgt"], strict=True)) <= {
        (" ".join(s.split()), " ".join(t.split())) for s, t in pairs
    }


def test_a_memory_is_read_a_unit_at_a_time_and_each_unit_freed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mtkit.data.tmx as tmx

    units = "".join(
        f'<tu><tuv xml:lang="de"><seg>s{n}</seg></tuv><tuv xml:lang="en"><seg>t{n}</seg></tuv></tu>' for n in range(5000)
    )
    split = SplitConfig(tmx=str(write_memory(tmp_path / "m.tmx", f"<tmx><body>{units}</body></tmx>")))
    read, iterparse = [], tmx.etree.iterparse

    def recorded(*args, **kwargs):
        for event, element in iterparse(*args, **kwargs):
            read.append(element)
            yield event, element

    monkeypatch.setattr(tmx.etree, "iterparse", recorded)
    held = []
    for number, pair in enumerate(iter_split(split, "de", tgt_lang="en")):
        assert pair == (f"s{number}", f"t{number}")
        held.append(len(read[-1].getparent()))  # the units the tree holds while this pair is read
    # what the parser has read ahead of the reader (a buffer's worth), not the file
    assert len(held) == 5000 and max(held) < 1000
