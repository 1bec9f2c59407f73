"""Fine-tuning (`train.init_from`): every rule of what a child takes from its parent, but its recipe's.

Here: the child keeps its parent's tokenizers (`mtkit tokenizer train` is refused, `mtkit prepare`
copies them), `--extend-vocab` grows them from the new data, `data.new_languages` adds language codes to an
imported NLLB-200, M2M-100 or mBART-50 model, and the parent's weights are loaded into the child's model
(new vocabulary rows start as the mean of their pieces' rows, a new code's as its named code's row or the
mean of every code's), or with `train.lora` kept frozen under adapters (`mtkit.models.lora`), its checkpoints
holding the adapters and a record of the parent. Such a model trains as its family does (`train_as_family`).
`mtkit prepare` calls `inherit_tokenizers` (through `mtkit.training.run_data`); `mtkit train` holds a `Lineage`
(through the trainer), which calls `load_parent`.

Not here: which recipe sections a child inherits and which of their keys it may change
(`mtkit.config.inherit_from_parent`, `INHERITED_SECTIONS`, `FREE_WHEN_INHERITED`). `load_config`
applies them while it reads a recipe, and config.py sits below every stage: it may not import this
module (it needs torch, checkpoints and the data stage), so the recipe side of fine-tuning stays
with the other recipe rules, where every command that loads a recipe gets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mtkit.config import Config
from mtkit.data.language_codes import added_code_pieces, new_languages, start_rows
from mtkit.data.prepare import check_language_codes, learn_tokenizers, save_tokenizers
from mtkit.data.tokenizer import BOS_ID, EOS_ID, UNK_ID, Tokenizer, TokenizerPair
from mtkit.errors import MtkitError, one_line
from mtkit.models.base import EncoderDecoder
from mtkit.models.checkpoint import (
    LORA_PARENT,
    check_parent,
    checkpoint_tokenizers,
    parent_record,
    read_checkpoint,
    tokenizer_payload,
)
from mtkit.models.lora import adapter_weights, apply_lora, bf16_base_on, load_adapters, load_base_weights
from mtkit.run_files import RunFiles
from mtkit.training.master_weights import full_precision_weights


def refuse_tokenizer_training(config: Config, source: str) -> None:
    """A fine-tuned model keeps its parent's tokenizers: learning new ones for its recipe (`source`) is an error."""
    if config.train.init_from:
        raise MtkitError(
            f"{source}: train.init_from is set, so the model keeps its parent's tokenizers; "
            "skip `mtkit tokenizer train` (`mtkit prepare` copies them), or remove train.init_from for a new vocabulary"
        )


def inherit_tokenizers(config: Config, extend_vocab: int = 0) -> str | None:
    """Write the parent's tokenizers (piece tables too) where `mtkit prepare` reads them, with
    `extend_vocab` > 0 extended by the pieces of a vocabulary of that size learnt from the new data;
    says what was written, e.g. "vocabulary 8000 + 412 new pieces". None for a recipe without a
    parent (its tokenizers are `mtkit tokenizer train`'s), where `extend_vocab` is an error."""
    if extend_vocab and not config.train.init_from:
        raise MtkitError(f"--extend-vocab {extend_vocab}: extends a parent's vocabulary; set train.init_from (or --init-from)")
    if config.data.new_languages and config.data.lang_tag != "code":
        raise MtkitError(
            f"data.new_languages {config.data.new_languages}: adds language codes to an imported NLLB-200, M2M-100 or "
            "mBART-50 model (data.lang_tag: code) fine-tuned with train.init_from; remove the key"
        )
    if not config.train.init_from:
        return None
    parent = checkpoint_tokenizers(read_checkpoint(Path(config.train.init_from)))
    tokenizers = extend_tokenizers(parent, config, size=extend_vocab) if extend_vocab else parent
    tokenizers = add_language_codes(tokenizers, config.data.new_languages)
    check_language_codes(config, tokenizers)
    save_tokenizers(tokenizers, config)
    sizes = [
        (side.vocab_size, new.vocab_size - side.vocab_size)
        for side, new in ((parent.src, tokenizers.src), (parent.tgt, tokenizers.tgt))
    ]
    shown = sizes[:1] if tokenizers.joint else sizes
    return " / ".join(f"vocabulary {size}" + (f" + {grown} new pieces" if grown else "") for size, grown in shown)


def extend_tokenizers(parent: TokenizerPair, config: Config, *, size: int) -> TokenizerPair:
    """`--extend-vocab`: the parent's tokenizers plus the pieces of `size`-piece models learnt from the new
    training data that they lack (one id space stays one: both sides get the pieces of both)."""
    if size < 8:
        raise MtkitError(f"--extend-vocab {size}: give the size of the vocabulary to learn from the new data, such as 8000")
    learned = learn_tokenizers(config, size, joint=parent.joint)  # joint: one model of both sides' text
    return TokenizerPair.of(parent.src.extended(learned.src), parent.tgt.extended(learned.tgt))


def add_language_codes(tokenizers: TokenizerPair, text: str) -> TokenizerPair:
    """The tokenizers with `data.new_languages`' codes (`text`) added after their pieces, as --extend-vocab adds
    pieces; a code the model has, or one named in another form than its codes, is an error."""
    if not text:
        return tokenizers
    table = tokenizers.src.table or []
    added = added_code_pieces(new_languages(text), tokenizers.src.codes, pieces=table)
    src = Tokenizer(tokenizers.src.model_proto, [*table, *added])
    tgt = src if tokenizers.joint else Tokenizer(tokenizers.tgt.model_proto, [*(tokenizers.tgt.table or []), *added])
    return TokenizerPair(src, tgt)


def load_parent(
    model: EncoderDecoder, payload: dict[str, Any], *, parent: str, tokenizers: TokenizerPair, config: Config
) -> str | None:
    """Load a parent's weights (`parent_weights`) into `model`; returns what a grown vocabulary did, to say (None
    when the vocabulary is the parent's)."""
    weights, said = parent_weights(model, payload, parent=parent, tokenizers=tokenizers, config=config)
    try:
        load_base_weights(model, weights)  # an adapted model's adapters stay as they were built
    except RuntimeError as err:
        raise MtkitError(f"{parent}: its weights do not fit the recipe's model ({one_line(err, limit=200)})") from None
    return said


def parent_weights(
    model: EncoderDecoder, payload: dict[str, Any], *, parent: str, tokenizers: TokenizerPair, config: Config
) -> tuple[dict[str, torch.Tensor], str | None]:
    """A parent's weights for `model`, and what a grown vocabulary did (None: the parent's vocabulary). The prepared
    data's `tokenizers` (of `config.data_path`) must be the parent's, or extend them (`mtkit prepare --extend-vocab`:
    new rows start as the mean of their pieces' rows; a new language code of data.new_languages as its named code's
    row or the mean of every code's)."""
    weights, theirs = payload["model"], checkpoint_tokenizers(payload)
    if LORA_PARENT in payload:
        raise MtkitError(
            f"{parent}: a LoRA run holds adapters alone; merge it first (mtkit merge {parent} -o DIR) and start from DIR"
        )
    said = None
    if extends(tokenizers, theirs) and config.train.lora is not None:
        raise MtkitError(
            f"{config.data_path}: prepared with a vocabulary grown from the parent {parent}'s, but train.lora keeps the "
            "parent's weights as they are: prepare without --extend-vocab and data.new_languages"
        )
    if extends(tokenizers, theirs):
        starts = start_rows(new_languages(config.data.new_languages), theirs.tgt.codes, pieces=theirs.tgt.table or [])
        weights = extend_rows(weights, model.vocabulary_rows(), parent=theirs, child=tokenizers, starts=starts)
        sizes = f"{theirs.src.vocab_size}/{theirs.tgt.vocab_size} -> {tokenizers.src.vocab_size}/{tokenizers.tgt.vocab_size}"
        said = f"vocabulary extended (source/target pieces {sizes}): new rows start as the mean of their pieces' rows"
        said += ", new language codes as their data.new_languages code's row (or every code's)" if starts else ""
    elif tokenizer_payload(theirs) != tokenizer_payload(tokenizers):
        raise MtkitError(
            f"{config.data_path}: prepared with other tokenizers than the parent {parent}; "
            "run `mtkit prepare RECIPE` again (with train.init_from it copies the parent's)"
        )
    return weights, said


def extends(child: TokenizerPair, parent: TokenizerPair) -> bool:
    """Whether `child` is `parent` with pieces added after its own on one side or both (`--extend-vocab`)."""
    sides = ((child.src, parent.src), (child.tgt, parent.tgt))
    grown = any(new.vocab_size > old.vocab_size for new, old in sides)
    return grown and all(new.all_pieces()[: old.vocab_size] == old.all_pieces() for new, old in sides)


def extend_rows(
    weights: dict[str, torch.Tensor], rows: dict[str, str], *, parent: TokenizerPair, child: TokenizerPair,
    starts: dict[str, list[int]] | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The parent's weights for the child's larger vocabulary: existing rows copied by id (the pieces keep
    their ids), each new piece's row the mean of the rows of its text as the parent segments it, or of the
    parent ids `starts` gives it (a new language code's)."""
    extended = dict(weights)
    for name, side in rows.items():
        old, new = getattr(parent, side), getattr(child, side)
        if name not in weights or new.vocab_size == old.vocab_size:
            continue
        table = weights[name]
        pieces = new.all_pieces()[old.vocab_size :]
        added = [table[(starts or {}).get(piece) or _segment(piece, old)].mean(dim=0) for piece in pieces]
        extended[name] = torch.cat([table, torch.stack(added)])
    return extended


def _segment(piece: str, tokenizer: Tokenizer) -> list[int]:
    """The ids the parent gives a new piece's text (its unknown id if none)."""
    return tokenizer.encode(piece.replace("\u2581", " ").strip() or piece) or [UNK_ID]


class Lineage:
    """A model's training as its parent's child: its family's rules (`train_as_family`), the parent's weights
    loaded whole or, with `train.lora`, frozen under adapters (the base in bf16 where `bf16_base_on`), and what a
    LoRA run's checkpoints record of that parent (`record`: its checkpoint and the digest of its weights)."""

    def __init__(self, model: EncoderDecoder, config: Config, *, tokenizers: TokenizerPair, device: torch.device) -> None:
        self.model, self.config, self.tokenizers = model, config, tokenizers
        self.record: dict[str, str] | None = None  # a LoRA run's, once the parent is loaded
        if config.train.lora is not None:  # the parent's weights come with `load`, into the frozen base
            apply_lora(model, config.train.lora, bf16_base=bf16_base_on(config.train, device=device))
        train_as_family(model, config)

    def load(self, payload: dict[str, Any], parent: str, *, expected: dict[str, str] | None = None) -> str | None:
        """The parent's weights (`load_parent`; what a grown vocabulary did, to say); a LoRA run's record of them,
        which must be `expected` where given (a resumed run's)."""
        said = load_parent(self.model, payload, parent=parent, tokenizers=self.tokenizers, config=self.config)
        if self.config.train.lora is not None:
            self.record = parent_record(Path(parent), payload["model"])
            if expected is not None:
                check_parent(self.record["weights_sha256"], expected, child=RunFiles(self.config.run_path).last)
        return said

    def resume(self, payload: dict[str, Any]) -> None:
        """last.pt's weights: the model's own, or a LoRA run's parent (checked against its record) and adapters."""
        if LORA_PARENT not in payload:
            self.model.load_state_dict(payload["model"])
            return
        parent = str(self.config.train.init_from)
        self.load(read_checkpoint(Path(parent)), parent, expected=payload[LORA_PARENT])
        load_adapters(self.model, payload["model"], mismatch=f"{RunFiles(self.config.run_path).last}: its adapters")

    def weights(self, optimizer: object) -> dict[str, torch.Tensor]:
        """What a checkpoint holds as the model: a LoRA run's adapters (the parent's weights are in its own
        checkpoint), else every weight, in fp32 also where the model holds bf16 weights."""
        return adapter_weights(self.model) if self.record is not None else full_precision_weights(self.model, optimizer)


def train_as_family(model: EncoderDecoder, config: Config) -> None:
    """A model with language codes (`data.lang_tag: code`, an imported NLLB-200, M2M-100 or mBART-50 model) trains
    as transformers trains its family's class, so that it exports to it again.

    Its family has one row for </s>, which starts the decoder and ends a sentence; mtkit's BOS and EOS rows hold it
    twice. They are kept one row by giving both the sum of their gradients (what a shared row receives): equal rows,
    equal gradients and Adam's elementwise update keep them equal, where copying one to the other after each update
    would drop the decoder start's gradient. The two rows are rewritten in place, each backward pass.
    The output bias (-10,000 on BOS, none or mBART's fixed final_logits_bias elsewhere) is not trained: transformers
    holds it as a buffer, and M2M100ForConditionalGeneration has none to export to. An embedding table adapted by
    train.lora keeps its adapter's two rows one row the same way (its `lora_A`, rows by id).
    """
    if config.data.lang_tag != "code":
        return
    named = dict(model.named_parameters())
    if "output.bias" in named:
        named["output.bias"].requires_grad_(False)
    rows = {name for name in model.vocabulary_rows() if name != "output.bias"}
    rows |= {name.removesuffix("weight") + "lora_A" for name in rows}
    for name in rows & named.keys():
        if named[name].requires_grad:
            named[name].register_hook(_one_row_for_bos_and_eos)


def _one_row_for_bos_and_eos(grad: torch.Tensor) -> torch.Tensor:
    """A (V, D) gradient whose BOS and EOS rows are both their sum. The embedding's backward gives a gradient of its
    own (the uses of a tied weight summed into one), so its two rows are written in place rather than the whole
    (256k-row) table copied each update; a view of another tensor is copied first."""
    tied = grad if grad._base is None and grad.is_contiguous() else grad.clone()
    both = grad[BOS_ID] + grad[EOS_ID]
    tied[BOS_ID], tied[EOS_ID] = both, both
    return tied
