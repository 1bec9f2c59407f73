"""The importers' table of families: `mtkit import auto` reads the family from config.json, and a family or
model_type mtkit does not know is one line listing the known ones; the run records its tokenizer's family, and no
family's name is typed outside its rows."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from helpers import source_tree
from marian_builder import Variant, build_marian
from typer.testing import CliRunner

import mtkit
from mtkit.cli import app
from mtkit.config import Config, DataConfig, ModelConfig, TokenizerConfig, load_config
from mtkit.errors import MtkitError
from mtkit.importers import FAMILIES, RunFamily, import_model, run_family
from mtkit.importers.loader import family_of
from mtkit.importers.m2m100 import M2M100_TOKENIZER, NLLB_TOKENIZER
from mtkit.importers.marian import MARIAN_TOKENIZER
from mtkit.importers.mbart import MBART50_TOKENIZER
from mtkit.models.checkpoint import read_checkpoint

pytestmark = [
    pytest.mark.usefixtures("transformers_installed"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]


def test_auto_imports_what_the_named_family_imports(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    build_marian(folder, Variant())
    runner = CliRunner()
    named = runner.invoke(app, ["import", "marian", str(folder), "-o", str(tmp_path / "named")])
    auto = runner.invoke(app, ["import", "auto", str(folder), "-o", str(tmp_path / "auto")])
    assert named.exit_code == 0 and auto.exit_code == 0, named.output + auto.output
    assert auto.output.replace(str(tmp_path / "auto"), str(tmp_path / "named")) == named.output
    expected, found = (read_checkpoint(tmp_path / run / "best.pt")["model"] for run in ("named", "auto"))
    assert expected.keys() == found.keys() and all(torch.equal(expected[key], found[key]) for key in expected)


def test_a_model_type_without_a_family_is_one_line_listing_the_known(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    build_marian(folder, Variant())
    settings = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**settings, "model_type": "t5"}))
    with pytest.raises(MtkitError, match=r"model_type 't5'.*marian \(marian\)") as raised:
        import_model(str(folder), tmp_path / "run")
    assert "\n" not in str(raised.value)
    where = folder / "config.json"  # without model_type, the architectures name the family
    assert family_of({"architectures": ["MarianMTModel"]}, where, families=FAMILIES) is FAMILIES["marian"]
    with pytest.raises(MtkitError, match=r"architectures \['T5Model'\].*marian"):
        family_of({"architectures": ["T5Model"]}, where, families=FAMILIES)


def test_an_unknown_family_is_one_line_listing_the_known(tmp_path: Path) -> None:
    with pytest.raises(MtkitError, match="choose one of marian, m2m100, mbart, auto") as raised:
        import_model("somewhere", tmp_path / "run", family="t5")
    assert "\n" not in str(raised.value) and list(FAMILIES) == ["marian", "m2m100", "mbart"]


# The families' knowledge stays in their rows: the exporters read the rows the run records (tokenizer.family).
ROW_MODULES = {f"importers/{name}.py" for name in ("marian", "m2m100", "mbart", "fairseq")}  # fairseq.py: what two share
ALLOWED = {  # (module, name): why it is typed there
    ("cli.py", "marian"): "`mtkit import marian`'s command name: the CLI imports no importer before a command runs",
    ("config.py", "nllb"): "tokenizer.family's example in the recipe checker's message: config.py is below the importers",
}


def _family_names() -> tuple[set[str], set[str]]:
    """The rows' short names (a family's, its model_type, its tokenizer's) and class names (transformers')."""
    short, classes = set(), set()
    for family in FAMILIES.values():
        short |= {family.name, *family.model_types, *(held.name for held in family.tokenizers)}
        classes |= {*family.architectures, *(held.class_name for held in family.tokenizers)}
    return short, classes


def _strings(tree: ast.Module) -> list[str]:
    """Every string constant of a module except docstrings (f-strings' literal parts included)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_family_name_is_typed_outside_the_family_rows() -> None:
    package = Path(mtkit.__file__).resolve().parent
    short, classes = _family_names()
    typed = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module in ROW_MODULES:
            continue
        for text in _strings(source_tree(path)):
            named = {text} & short | {name for name in classes if name in text}
            typed += [f"{module}: {name!r}" for name in sorted(named) if (module, name) not in ALLOWED]
    assert not typed, "read these from the family's row (mtkit.importers), or add them to ALLOWED with the reason"


def test_each_import_records_its_tokenizer_family(tmp_path: Path) -> None:
    from fairseq_builder import build

    expected = {"nllb": NLLB_TOKENIZER, "m2m100": M2M100_TOKENIZER, "mbart": MBART50_TOKENIZER, "marian": MARIAN_TOKENIZER}
    folders = {name: build(name, tmp_path / name).folder for name in expected if name != "marian"}
    build_marian(tmp_path / "marian", Variant())
    folders["marian"] = tmp_path / "marian"
    for name, folder in folders.items():
        held = expected[name]
        import_model(str(folder), tmp_path / f"run_{name}")
        config = load_config(tmp_path / f"run_{name}" / "config.yaml")
        assert config.tokenizer.family == held.name
        codes = [piece for piece in ("deu_Latn", "__de__", "de_DE") if held.writes(piece)]
        family = next(family for family in FAMILIES.values() if held in family.tokenizers)
        assert run_family(config, codes) == RunFamily(family, held)


def _config(**sections: object) -> Config:
    return Config(**sections)  # type: ignore[arg-type]


def test_a_run_without_the_record_is_known_by_its_model_keys_and_codes() -> None:
    coded = DataConfig(lang_tag="code")
    m2m100 = ModelConfig(positions="sinusoidal_fairseq")
    assert run_family(_config(data=coded, model=m2m100), ["__de__", "__en__"]) == RunFamily(FAMILIES["m2m100"], M2M100_TOKENIZER)
    assert run_family(_config(data=coded, model=m2m100), ["deu_Latn", "eng_Latn"]) == RunFamily(
        FAMILIES["m2m100"], NLLB_TOKENIZER
    )
    mbart = ModelConfig(positions="learned", embedding_norm=True)
    assert run_family(_config(data=coded, model=mbart), ["de_DE"]) == RunFamily(FAMILIES["mbart"], MBART50_TOKENIZER)
    assert run_family(_config(), []) is None  # mtkit's own model
    with pytest.raises(MtkitError, match=r"data.lang_tag: code.*re-import it") as raised:
        run_family(_config(data=coded), ["de_DE"])
    with pytest.raises(MtkitError, match="tokenizer.family 'klingon': not a family mtkit knows; it knows marian, m2m100, nllb"):
        run_family(_config(tokenizer=TokenizerConfig(family="klingon")), [])
    with pytest.raises(MtkitError, match="tokenizer.family 'nllb': the model lacks that family's keys"):
        run_family(_config(data=coded, model=mbart, tokenizer=TokenizerConfig(family="nllb")), ["de_DE"])
    assert "\n" not in str(raised.value)


def test_a_folder_s_tokenizer_class_is_the_one_it_names_else_the_one_writing_its_codes() -> None:
    family = FAMILIES["m2m100"]
    assert family.tokenizer("NllbTokenizerFast", ["__de__"]) is NLLB_TOKENIZER
    assert family.tokenizer("M2M100Tokenizer", ["deu_Latn"]) is M2M100_TOKENIZER
    assert family.tokenizer(None, ["__de__", "__fr__"]) is M2M100_TOKENIZER
    assert family.tokenizer("PreTrainedTokenizerFast", ["deu_Latn", "__fr__"]) is NLLB_TOKENIZER
    assert M2M100_TOKENIZER.piece("de") == "__de__" and not M2M100_TOKENIZER.writes("____")
