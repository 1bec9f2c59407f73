"""Import Hugging Face mBART-50 checkpoints (transformers' `MBartForConditionalGeneration`).

fairseq's pre-norm Transformer with learned positions (transformers' table has two rows before position
0, which the import leaves out), a LayerNorm on the embeddings (`embedding_norm: true`), GELU, and a
bias on the output logits; its tokenizer and weights are read as M2M-100's are (fairseq.py).
"""

from __future__ import annotations

from mtkit.importers.fairseq import FairseqSettings, fairseq_family

MBART = fairseq_family(
    FairseqSettings(positions="learned", embedding_norm=True, scale_embedding=False),  # MBartConfig's defaults
    name="mbart",
    title="mBART-50",
    model_type="mbart",
    architecture="MBartForConditionalGeneration",
    example="facebook/mbart-large-50-many-to-many-mmt",
)
