"""Import Hugging Face M2M-100 and NLLB-200 checkpoints (transformers' `M2M100ForConditionalGeneration`).

Both are fairseq's pre-norm Transformer with final layer norms, scaled embeddings tied to the output, a
ReLU feed-forward and fairseq's sinusoids (`positions: sinusoidal_fairseq`); they differ only in their
tokenizer files (NLLB's tokenizer.json, M2M-100's vocab.json) and codes, which fairseq.py reads.
"""

from __future__ import annotations

from mtkit.importers.fairseq import FairseqSettings, fairseq_family

M2M100 = fairseq_family(
    FairseqSettings(positions="sinusoidal_fairseq", embedding_norm=False, scale_embedding=True),  # M2M100Config's
    name="m2m100",
    title="M2M-100 or NLLB-200",
    model_type="m2m_100",
    architecture="M2M100ForConditionalGeneration",
    example="facebook/nllb-200-distilled-600M",
)
