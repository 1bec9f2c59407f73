"""Fine-tuning without a parent run: `train.freeze` names only parts the model has (fine-tuning itself is in
tests/integration/training/test_finetune.py)."""

from __future__ import annotations

import pytest
import yaml
from helpers import reverse_task_config

from mtkit.config import config_to_dict, load_config
from mtkit.errors import MtkitError


def test_freeze_names_only_parts_the_model_has(tmp_path):
    config = reverse_task_config(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
    with pytest.raises(MtkitError, match="train.freeze"):
        load_config(tmp_path / "recipe.yaml", ["train.freeze=embeddings,attention"])
