"""The fixed choices of command-line options, as `Enum`s so that `--help` lists them.

Kept free of heavy imports: the CLI reads them before it loads torch.
"""

from __future__ import annotations

from enum import Enum


class BadBytes(str, Enum):
    """What to do with input bytes that are not UTF-8."""

    ERROR = "error"
    REPLACE = "replace"


class EngineName(str, Enum):
    """Which engine translates (auto: CTranslate2 for an `mtkit export` directory, else PyTorch)."""

    AUTO = "auto"
    PYTORCH = "pytorch"
    CTRANSLATE2 = "ctranslate2"


class ExportFormat(str, Enum):
    CTRANSLATE2 = "ctranslate2"
    TRANSFORMERS = "transformers"


class Quantization(str, Enum):
    """Weight types of a CTranslate2 export (float32 keeps the trained weights)."""

    INT8 = "int8"
    INT8_FLOAT32 = "int8_float32"
    INT8_FLOAT16 = "int8_float16"
    INT8_BFLOAT16 = "int8_bfloat16"
    INT16 = "int16"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class Split(str, Enum):
    """A recipe split that has references to score against."""

    VALID = "valid"
    TEST = "test"


class ConstraintOrder(str, Enum):
    """Whether lexical constraints may appear in any order or must follow the order given."""

    ANY = "any"
    GIVEN = "given"

    @classmethod
    def of(cls, *, in_order: bool) -> ConstraintOrder:
        """The choice that `Decoding.constraints_in_order` means."""
        return cls.GIVEN if in_order else cls.ANY


class QualityMetric(str, Enum):
    """A neural metric `evaluate` adds to sacreBLEU's: COMET against the references, or COMET-QE from the source."""

    COMET = "comet"
    QE = "qe"


class CometPrecision(str, Enum):
    FP32 = "fp32"
    BF16 = "bf16"


class RerankMethod(str, Enum):
    """How `translate --rerank` chooses among candidates: a COMET-QE model's best, or minimum Bayes risk (the consensus)."""

    QE = "qe"
    MBR = "mbr"


class MbrUtility(str, Enum):
    """How minimum-Bayes-risk reranking measures two candidates' agreement."""

    CHRF = "chrf"
    COMET = "comet"


class SplitBy(str, Enum):
    """What the translator reads at a time: each sentence of a line (a paragraph is cut with a sentence splitter and
    rebuilt with its own spacing), or each line whole (cut only past decode.max_input_tokens)."""

    SENTENCES = "sentences"
    LINES = "lines"
