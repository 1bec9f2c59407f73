"""Every default stated once: an option of `translate`, `serve` or `evaluate`, or a field of the server's request,
that sets a field of an option object (`Decoding`, `Sampling`, `FileOptions`, `ServeLimits`, `PairedTests`,
`CometOptions`) has that field's default, and reads it from the dataclass instead of typing it again (None stays
where the field's default is None too: the recipe's value, or nothing given)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from helpers import source_tree

from mtkit.cli import app
from mtkit.config import SyntheticDecodeConfig
from mtkit.decoding.options import Decoding, FileOptions, Sampling
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.significance import PairedTests
from mtkit.options import ConstraintOrder
from mtkit.serving.app import TranslateRequest
from mtkit.serving.limits import HOST, ServeLimits

PACKAGE = Path(__file__).resolve().parents[1] / "mtkit"
DECODING, SAMPLING, COMET = Decoding(), Sampling(), CometOptions(model="")
# Per command, the option objects whose fields its options set under the same name.
OWNERS: dict[str, list[Any]] = {
    "translate": [DECODING, SAMPLING, FileOptions()],
    "serve": [ServeLimits()],
    "evaluate": [PairedTests()],
    "request": [DECODING, SAMPLING],  # POST /translate's body
}
# Options that set a field under another name (or in another form): the default that field means.
RENAMED: dict[tuple[str, str], Any] = {
    ("translate", "constraints_order"): ConstraintOrder.of(in_order=DECODING.constraints_in_order),
    ("request", "constraints_order"): ConstraintOrder.of(in_order=DECODING.constraints_in_order),
    ("evaluate", "comet_precision"): COMET.precision,
    ("serve", "host"): HOST,
}
# The modules that define the option objects (and the constants beside them): a default that reads a name they define
# is stated there.
OWNER_MODULES = {
    "mtkit.decoding.options",
    "mtkit.serving.limits",
    "mtkit.evaluation.significance",
    "mtkit.evaluation.comet.options",
}


def field_default(owners: list[Any], name: str) -> tuple[bool, Any]:
    """(found, default) of the field `name` of the first owner that has one."""
    for owner in owners:
        if name in {field.name for field in dataclasses.fields(owner)}:
            return True, getattr(owner, name)
    return False, None


def plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def expected_defaults(where: str, names: list[str]) -> dict[str, Any]:
    """The default each of `names` must have at `where` (a command, or "request"), for those that mirror a field."""
    expected = {}
    for name in names:
        found, default = field_default(OWNERS[where], name)
        if (where, name) in RENAMED:
            expected[name] = RENAMED[where, name]
        elif found:
            expected[name] = default
    return expected


def drifted(where: str, defaults: dict[str, Any]) -> list[str]:
    """`where name` for each of `defaults` that mirrors a field and differs from the field's default."""
    expected = expected_defaults(where, list(defaults))
    return [f"{where} {name}" for name, value in expected.items() if plain(defaults[name]) != plain(value)]


def command_defaults(application: typer.Typer, command: str) -> dict[str, Any]:
    group = typer.main.get_command(application)  # a group of Typer's own copy of click
    return {param.name: param.default for param in group.commands[command].params if param.name}


@pytest.mark.parametrize("command", ["translate", "serve", "evaluate"])
def test_each_option_that_sets_a_field_has_its_default(command):
    defaults = command_defaults(app, command)
    assert len(expected_defaults(command, list(defaults))) >= 3  # the owners still name this command's options
    assert drifted(command, defaults) == []


def test_each_request_field_that_sets_a_field_has_its_default():
    defaults = {name: field.default for name, field in TranslateRequest.model_fields.items()}
    mirrored = {"beam", "nbest", "temperature", "seed", "no_repeat_ngram", "alignments", "constraints_order"}
    assert mirrored <= set(expected_defaults("request", list(defaults)))
    assert drifted("request", defaults) == []


def test_sampling_defaults_are_the_same_where_a_recipe_or_parse_reads_them():
    parse = inspect.signature(Sampling.parse).parameters
    synthetic = SyntheticDecodeConfig()
    for name in ("temperature", "seed"):
        assert parse[name].default == getattr(SAMPLING, name) == getattr(synthetic, name)
    assert Sampling.parse("full") == SAMPLING


def owner_names(tree: ast.Module) -> set[str]:
    """The names through which a module reads the option objects: those it imports from OWNER_MODULES, and those
    bound at its top to an option object built with its defaults (`LIMITS = ServeLimits()`)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in OWNER_MODULES:
            names |= {alias.asname or alias.name for alias in node.names}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            for target, value in zip(targets, values, strict=True):
                called = value.func.id if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else None
                if called in names and isinstance(target, ast.Name):
                    names.add(target.id)
    return names


def typed_again(where: str, defaults: dict[str, ast.expr], owners: set[str]) -> list[str]:
    """`where name` for each default in `defaults` that mirrors a field but does not read one of `owners`
    (None is kept where the field's default is None)."""
    expected = expected_defaults(where, list(defaults))
    found = []
    for name, node in defaults.items():
        if name not in expected or (isinstance(node, ast.Constant) and node.value is None and expected[name] is None):
            continue
        if not {child.id for child in ast.walk(node) if isinstance(child, ast.Name)} & owners:
            found.append(f"{where} {name}")
    return found


def cli_defaults(tree: ast.Module, command: str) -> dict[str, ast.expr]:
    """Each parameter of the command's function with its default, as written."""
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == f"{command}_command")
    arguments = function.args.args
    return {
        argument.arg: default
        for argument, default in zip(
            arguments[len(arguments) - len(function.args.defaults) :], function.args.defaults, strict=True
        )
    }


def request_defaults(tree: ast.Module) -> dict[str, ast.expr]:
    """Each field of TranslateRequest with its default as written (a `Field(...)`'s first argument or `default=`)."""
    request = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TranslateRequest")
    found = {}
    for node in request.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Field":
                value = value.args[0] if value.args else next((k.value for k in value.keywords if k.arg == "default"), value)
            found[node.target.id] = value
    return found


def test_no_default_of_an_option_object_is_typed_again():
    cli, server = source_tree(PACKAGE / "cli.py"), source_tree(PACKAGE / "serving" / "app.py")
    found = [
        name
        for command in ("translate", "serve", "evaluate")
        for name in typed_again(command, cli_defaults(cli, command), owner_names(cli))
    ]
    found += typed_again("request", request_defaults(server), owner_names(server))
    assert found == []


def test_the_checks_find_a_default_typed_again_and_one_that_drifted():
    planted = ast.parse(
        "from mtkit.serving.limits import ServeLimits\nfrom mtkit.decoding.options import Decoding, Sampling\n"
        "from mtkit.options import ConstraintOrder\nLIMITS = ServeLimits()\nDECODING, SAMPLING = Decoding(), Sampling()\n"
        "def translate_command(model, nbest=1, temperature=SAMPLING.temperature, beam=None, seed=2,\n"
        "                      constraints_order=ConstraintOrder.ANY): ...\n"
        "class TranslateRequest:\n    nbest: int = Field(1, ge=1)\n    seed: int = Field(SAMPLING.seed)\n"
        "    alignments: bool = False\n    beam: int | None = Field(None)\n"
    )
    assert owner_names(planted) == {"ServeLimits", "Decoding", "Sampling", "LIMITS", "DECODING", "SAMPLING"}
    owners = owner_names(planted)
    assert typed_again("translate", cli_defaults(planted, "translate"), owners) == [
        "translate nbest",
        "translate seed",
        "translate constraints_order",
    ]
    assert typed_again("request", request_defaults(planted), owners) == ["request nbest", "request alignments"]
    changed = typer.Typer()

    @changed.command("translate")
    def translate(nbest: int = DECODING.nbest + 1, seed: int = SAMPLING.seed, constraints_order: str = "given") -> None: ...

    @changed.command("other")
    def other() -> None: ...

    assert drifted("translate", command_defaults(changed, "translate")) == ["translate nbest", "translate constraints_order"]
    assert drifted("request", {"temperature": SAMPLING.temperature + 1, "text": None}) == ["request temperature"]
