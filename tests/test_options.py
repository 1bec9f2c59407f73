"""Arguments by name. Every public function, method and constructor in mtkit/ with more than two parameters or
any boolean one takes at most its first two positionally and every boolean after `*`: a parameter added in the
middle of a positional call would bind silently to the wrong one, and `f(path, True, False)` says nothing where it
is called. A dataclass with more than two fields or a boolean field is `kw_only=True`. The rule reads the source
of every module, so a new function is covered without being listed; its few exemptions are below with their
reasons. The option objects are also frozen, and no call in mtkit/, tests/ or benchmarks/ passes more positional
arguments than its function takes (caught here, not when a rarely taken path first runs)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import source_tree

from mtkit.decoding.options import Decoding, FileOptions, Sampling
from mtkit.decoding.search import SearchOptions
from mtkit.decoding.terminology.constrained import TermRequest
from mtkit.evaluation.report import EvaluateRequest
from mtkit.evaluation.significance import PairedTests
from mtkit.serving.app import ServeLimits
from mtkit.serving.batcher import QueuedRequest
from mtkit.synthetic.jobs import SyntheticJob
from mtkit.training.levers import Levers
from mtkit.training.run_writer import Checkpoint

OPTION_CLASSES = [
    Decoding, SearchOptions, FileOptions, EvaluateRequest, ServeLimits, Sampling, PairedTests, SyntheticJob, QueuedRequest,
    Levers, Checkpoint, TermRequest,
]  # fmt: skip
REPO = Path(__file__).resolve().parents[1]
MOST_POSITIONAL = 2
BOOLEANS = {"bool", "bool|None", "None|bool", "Optional[bool]", "typing.Optional[bool]"}
# What the rule leaves alone, and why. Each is recognised by what the code is, not by a list of names to update:
#  - Typer commands (a function under `@...command(...)` in cli.py): Typer calls it with every option by keyword,
#    and its parameters are the command's `--flags`.
#  - `forward` of a module: its tensors come through `nn.Module.__call__` (hooks, torch.compile and activation
#    checkpointing pass them as given), so tensor inputs may stay positional; a boolean still goes after `*`.
#  - `torch.autograd.Function` subclasses: `Function.apply` hands its arguments to `forward` positionally only.
#  - LIBRARY_OVERRIDES: a method that overrides a library's keeps the library's signature, or its callers break.
LIBRARY_OVERRIDES = {"MasterWeightOptimizer.zero_grad": "torch.optim.Optimizer.zero_grad(set_to_none=True)"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Signature:
    """The parameters of one function or constructor as its callers see them (no `self` or `cls`)."""

    where: str
    name: str
    positional: list[tuple[str, bool]]  # (name, is it a boolean), in order
    keyword: list[tuple[str, bool]]
    tensors_positional: bool = False  # a module's `forward`: only its booleans are checked
    dataclass: bool = False

    def allowed(self) -> int:
        """How many parameters may stay positional."""
        everything = self.positional + self.keyword
        if len(everything) <= MOST_POSITIONAL and not any(boolean for _, boolean in everything):
            return len(self.positional)
        limits = [index for index, (_, boolean) in enumerate(self.positional) if boolean]
        limits += [len(self.positional) if self.tensors_positional else MOST_POSITIONAL]
        return min(limits)

    def offence(self) -> str | None:
        allowed = self.allowed()
        if len(self.positional) <= allowed:
            return None
        names = ", ".join(name for name, _ in self.positional + self.keyword)
        fix = "add `kw_only=True` to its @dataclass" if self.dataclass else f"put `*` before `{self.positional[allowed][0]}`"
        return f"{self.where} {self.name}({names}): {fix}, and pass those arguments by name"


def is_boolean(parameter: ast.arg | ast.AnnAssign, default: ast.expr | None) -> bool:
    if isinstance(default, ast.Constant) and isinstance(default.value, bool):
        return True
    annotation = parameter.annotation
    text = annotation.value if isinstance(annotation, ast.Constant) else ast.unparse(annotation) if annotation else ""
    return str(text).replace(" ", "") in BOOLEANS


def decorators(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> list[ast.expr]:
    """What decorates `node`, without the arguments: `app.command` for `@app.command("train")`."""
    return [decorator.func if isinstance(decorator, ast.Call) else decorator for decorator in node.decorator_list]


def function_signature(function: ast.FunctionDef | ast.AsyncFunctionDef, where: str, owner: str | None) -> Signature:
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    pairs = [(arg.arg, is_boolean(arg, default)) for arg, default in zip(positional, defaults, strict=True)]
    if owner is not None and "staticmethod" not in map(ast.unparse, decorators(function)):
        pairs = pairs[1:]
    keyword = [
        (arg.arg, is_boolean(arg, default)) for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    ]
    name = function.name if owner is None else owner if function.name == "__init__" else f"{owner}.{function.name}"
    forward = owner is not None and function.name == "forward"
    return Signature(where=where, name=name, positional=pairs, keyword=keyword, tensors_positional=forward)


def dataclass_signature(node: ast.ClassDef, where: str) -> Signature | None:
    """The generated `__init__` of a dataclass (None if `node` is not one)."""
    found = [d for d in node.decorator_list if ast.unparse(d.func if isinstance(d, ast.Call) else d).endswith("dataclass")]
    if not found:
        return None
    options = {keyword.arg: ast.literal_eval(keyword.value) for d in found if isinstance(d, ast.Call) for keyword in d.keywords}
    positional, keyword, by_name = [], [], bool(options.get("kw_only"))
    for item in node.body:
        if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
            continue
        annotation = ast.unparse(item.annotation)
        by_name = by_name or annotation.endswith("KW_ONLY")
        value = item.value
        not_in_init = isinstance(value, ast.Call) and any(k.arg == "init" for k in value.keywords)
        if "ClassVar" in annotation or annotation.endswith("KW_ONLY") or not_in_init:
            continue
        (keyword if by_name else positional).append((item.target.id, is_boolean(item, value)))
    return Signature(where=where, name=node.name, positional=positional, keyword=keyword, dataclass=True)


def exempt_function(function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None) -> bool:
    if owner is None:
        return any(ast.unparse(decorator).endswith("command") for decorator in decorators(function))
    if f"{owner.name}.{function.name}" in LIBRARY_OVERRIDES:
        return True
    return any(ast.unparse(base).endswith("autograd.Function") or ast.unparse(base) == "Function" for base in owner.bases)


def public_signatures(tree: ast.Module, where: str) -> Iterator[Signature]:
    """Every public function, method and constructor (a public class's `__init__`) of a module, and the generated
    constructor of its public dataclasses, except the exemptions above."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            if not exempt_function(node, None):
                yield function_signature(node, f"{where}:{node.lineno}", None)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            if (generated := dataclass_signature(node, f"{where}:{node.lineno}")) is not None:
                yield generated
            for item in node.body:
                public = item.name == "__init__" or not item.name.startswith("_") if hasattr(item, "name") else False
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and public and not exempt_function(item, node):
                    yield function_signature(item, f"{where}:{item.lineno}", node.name)


def package_signatures() -> list[Signature]:
    return [
        signature
        for path in sorted((REPO / "mtkit").rglob("*.py"))
        for signature in public_signatures(source_tree(path), str(path.relative_to(REPO)))
    ]


def offences(source: str) -> list[str]:
    return [found for signature in public_signatures(ast.parse(source), "planted.py") if (found := signature.offence())]


def test_every_public_function_takes_its_options_by_name():
    found = [found for signature in package_signatures() if (found := signature.offence())]
    assert not found, "\n".join(["positional options (see tests/test_options.py for the rule):", *found])


def test_the_rule_finds_planted_positional_options():
    planted = (
        "def write(path, data, force: bool = False): ...\n"
        "def plot(path, data, title, *, dpi): ...\n"
        "class Run:\n    def __init__(self, path, resume: bool): ...\n    def save(self, step: bool | None): ...\n"
        "    def forward(self, x, memory, mask, need_weights=False): ...\n"
        "@dataclass(frozen=True)\nclass Row:\n    name: str\n    score: float\n    digits: int\n"
    )
    assert offences(planted) == [
        "planted.py:1 write(path, data, force): put `*` before `force`, and pass those arguments by name",
        "planted.py:2 plot(path, data, title, dpi): put `*` before `title`, and pass those arguments by name",
        "planted.py:4 Run(path, resume): put `*` before `resume`, and pass those arguments by name",
        "planted.py:5 Run.save(step): put `*` before `step`, and pass those arguments by name",
        "planted.py:6 Run.forward(x, memory, mask, need_weights): put `*` before `need_weights`, and pass those "
        "arguments by name",
        "planted.py:8 Row(name, score, digits): add `kw_only=True` to its @dataclass, and pass those arguments by name",
    ]


def test_the_rule_accepts_keyword_options_and_its_exemptions():
    fine = (
        "def write(path, data, *, force: bool = False): ...\n"
        "def pair(first, second): ...\n"
        "def _private(a, b, c, d=True): ...\n"
        "@app.command('train')\ndef train_command(recipe, overrides, resume: bool = False): ...\n"
        "class Loss(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, logits, target, smoothing): ...\n"
        "class Layer:\n    def forward(self, x, memory, mask, *, need_weights=False): ...\n"
        "    def __call__(self, a, b, c): ...\n"
        "@dataclass(frozen=True, kw_only=True)\nclass Row:\n    name: str\n    score: float\n    digits: int\n"
        "@dataclass\nclass Pair:\n    src: str\n    tgt: str\n    _: KW_ONLY\n    weight: float\n    tagged: bool\n"
    )
    assert offences(fine) == []


@pytest.mark.parametrize("option_class", OPTION_CLASSES, ids=lambda c: c.__name__)
def test_option_classes_are_keyword_only_and_frozen(option_class):
    assert option_class.__dataclass_params__.frozen
    assert all(field.kw_only for field in dataclasses.fields(option_class))
    with pytest.raises(TypeError, match="positional"):
        option_class(1)


def positional_limits() -> dict[str, int]:
    """How many arguments each public module-level function or class of mtkit takes positionally, for the names
    that mean one thing: a name defined twice counts with the larger limit, and one that is also a method's, or
    belongs to a function without keyword-only parameters (which may take `*args`), is left to Python's own check."""
    limits: dict[str, float] = {}
    for signature in package_signatures():
        name = signature.name.rpartition(".")[2]
        limit = len(signature.positional) if signature.keyword and "." not in signature.name else float("inf")
        limits[name] = max(limits.get(name, 0), limit)
    return {name: int(limit) for name, limit in limits.items() if limit != float("inf")}


def foreign_names(tree: ast.Module) -> set[str]:
    """The names a file binds to what is not mtkit's: other packages' imports (uvicorn's `Config` is not mtkit's)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name.split(".")[0] != "mtkit"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] != "mtkit":
            found |= {alias.asname or alias.name for alias in node.names}
    return found


def positional_calls(tree: ast.Module, where: str, limits: dict[str, int]) -> list[str]:
    """`where:line name` for each call in `tree` of a function or class of `limits` with more positional arguments
    than it takes (a `*args` counts as too many): `name(...)`, or `module.name(...)` where `module` is not another
    package's (a method's calls are Python's to check: which class an object is, the source does not say)."""
    found, foreign = [], foreign_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
            while isinstance(receiver, ast.Attribute):
                receiver = receiver.value
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            root = receiver.id if isinstance(receiver, ast.Name) else name if receiver is None else None
            starred = any(isinstance(argument, ast.Starred) for argument in node.args)
            if name in limits and root not in foreign and (len(node.args) > limits[name] or starred):
                found.append(f"{where}:{node.lineno} {name}")
    return found


def test_the_call_check_finds_a_planted_positional_call():
    limits = {"validate": 1, "QueuedRequest": 0}
    planted = "def f(engine, batcher, model):\n    validate(model, valid, tokenizers)\n    QueuedRequest(lines)\n"
    assert positional_calls(ast.parse(planted), "planted.py", limits) == ["planted.py:2 validate", "planted.py:3 QueuedRequest"]
    fine = "import uvicorn\nvalidate(engine, tokenizers=t)\nLevers(compile=True)\nuvicorn.QueuedRequest(app, port=1)\n"
    assert positional_calls(ast.parse(fine), "fine.py", limits) == []


def own_names(tree: ast.Module) -> set[str]:
    """The functions and classes a test or benchmark file defines itself (its `train` is not mtkit's)."""
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def test_no_call_passes_options_positionally():
    limits, found = positional_limits(), []
    for path in [path for folder in ("mtkit", "tests", "benchmarks") for path in sorted((REPO / folder).rglob("*.py"))]:
        tree, where = source_tree(path), str(path.relative_to(REPO))
        local = {} if where.startswith("mtkit/") else own_names(tree)
        found += positional_calls(tree, where, {name: limit for name, limit in limits.items() if name not in local})
    assert found == []
