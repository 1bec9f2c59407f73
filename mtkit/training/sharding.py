"""How the training processes hold the model: whole in each (one process, DDP), or sharded (`train.shard: fsdp`
under torchrun), where torch's FSDP2 holds each process's share of the weights, gradients and Adam's moments,
and the whole model exists only layer by layer, while it computes.

`shard_training` shards each repeated layer (`EncoderDecoder.repeated_blocks`), shares the rows of the
embeddings and the output layer among the processes (`mtkit.training.vocabulary_shards`: FSDP would gather those
tables whole), then shards the training forward module as the root (the norms, an output bias), computing in
bf16 on CUDA (FSDP's MixedPrecisionPolicy; fp32 gradients reduced) and in fp32 on the CPU (gloo, for the tests).
The trainer holds its model through `hold_model`: a `WholeModel` (one process, DDP) or a `ShardedModel`, which
gives the whole weights (rank 0 writes best.pt and last.pt in mtkit's usual format, which every other command
reads, and validates a plain copy) and writes and reads the exact training state with
`torch.distributed.checkpoint` (DCP).

The state of update N is RUN/sharded/step_N/: one file per process and DCP's metadata, written by every rank.
Rank 0 then writes last.pt, which names that folder and the number of processes, and removes the older folders:
last.pt is the atomic switch, as it is for the other files, and a folder it does not name is an interrupted
write (`RunWriter` removes it). All processes need the run directory on one file system.

torch's FSDP, DTensor and DCP modules are imported where they are used: they take about a second to import,
which an unsharded training does not pay.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mtkit.config import Config
from mtkit.distributed import Distributed, barrier
from mtkit.errors import MtkitError
from mtkit.models.base import EncoderDecoder
from mtkit.models.checkpoint import model_with_weights
from mtkit.run_files import RunFiles
from mtkit.training.finetune import Lineage, parent_weights
from mtkit.training.master_weights import MasterWeightOptimizer
from mtkit.training.vocabulary_shards import ShardedTeacherForcing, shard_vocabulary


def check_sharding(config: Config, distributed: Distributed) -> None:
    """The refusals that need the whole recipe or the job (the train keys' own are the recipe checker's):
    one line each, before anything is written."""
    if config.train.shard != "fsdp":
        return
    if not distributed.enabled:
        raise MtkitError(
            "train.shard=fsdp shares the model among the processes of a torchrun job: start it with "
            "torchrun --nproc_per_node N -m mtkit train RECIPE (N >= 2), or set train.shard=none"
        )
    if config.model.arch != "transformer":
        raise MtkitError(
            f"train.shard=fsdp shards a Transformer layer by layer; a model.arch={config.model.arch} model has no "
            "repeated layers to shard: set train.shard=none"
        )
    if not _fsdp_ignores_params():
        raise MtkitError(
            f"train.shard=fsdp keeps the vocabulary's rows sharded beside FSDP, which needs fully_shard's ignored_params "
            f"(torch {torch.__version__} lacks it): install a newer torch (the Makefile's pin), or set train.shard=none"
        )
    if config.data.lang_tag == "code":
        raise MtkitError(
            "train.shard=fsdp cannot train a model with language codes (data.lang_tag: code): its one </s> row is kept "
            "by a gradient hook that FSDP's sharded weights do not run; set train.shard=none"
        )


def _fsdp_ignores_params() -> bool:
    """Whether this torch's `fully_shard` takes `ignored_params` (what keeps the vocabulary's rows apart)."""
    import inspect

    from torch.distributed.fsdp import fully_shard

    return "ignored_params" in inspect.signature(fully_shard).parameters


def shard_training(forward: nn.Module, model: EncoderDecoder, *, amp_dtype: torch.dtype | None) -> nn.Module:
    """Shard `model`'s repeated layers and its vocabulary's rows (`vocabulary_shards`), in place; the module the
    step calls, computing `forward`'s loss (its label smoothing) with the output layer's rows sharded, sharded
    itself as the root (the norms, the output bias). bf16 `amp_dtype` (CUDA) computes with bf16 copies of each
    layer's weights and reduces fp32 gradients."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    bf16 = amp_dtype == torch.bfloat16
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))  # FSDP's own default, shared with the rows
    for block in model.repeated_blocks():
        fully_shard(block, mesh=mesh, mp_policy=policy)
    tables = shard_vocabulary(model, mesh, dtype=policy.param_dtype)
    root = ShardedTeacherForcing(model, forward.label_smoothing, amp_dtype=amp_dtype)
    fully_shard(root, mesh=mesh, mp_policy=policy, ignored_params=tables)
    return root


@dataclass(frozen=True, kw_only=True)
class SavedWeights:
    """What one validation saves of the model: what a checkpoint holds as its weights (`Lineage.weights`; sharded,
    the whole fp32 weights on rank 0 and none elsewhere) and last.pt's record of the optimiser: its state, or with
    train.shard=fsdp the folder of the shards."""

    weights: dict[str, Tensor]
    # {"optimizer": state}, or {"sharded": {"folder": "sharded/step_N", "processes": N, "optimizer": whether saved}}
    record: dict[str, Any]


class WholeModel:
    """A model each process holds whole (one process, or DDP under torchrun), its optimiser and its `lineage`
    (the parent's weights, LoRA's adapters)."""

    def __init__(self, lineage: Lineage, optimizer: torch.optim.Optimizer | MasterWeightOptimizer) -> None:
        self.lineage, self.model, self.optimizer = lineage, lineage.model, optimizer

    def save(self, step: int) -> SavedWeights:
        """What a checkpoint holds as the model (`Lineage.weights`) and the optimiser's state, as they are (no copy)."""
        weights = self.lineage.weights(self.optimizer)
        return SavedWeights(weights=weights, record={"optimizer": self.optimizer.state_dict()})

    def restore(self, payload: dict[str, Any], *, last: Path) -> None:
        """The weights and optimiser of a last.pt `payload` (at `last`), which an unsharded training wrote."""
        if "sharded" in payload:
            processes = payload["sharded"]["processes"]
            raise MtkitError(
                f"{last}: written by train.shard=fsdp over {processes} processes; resume it with train.shard=fsdp under "
                f"torchrun --nproc_per_node {processes}"
            )
        self.lineage.resume(payload)
        self.optimizer.load_state_dict(payload["optimizer"])

    def load_parent(self, payload: dict[str, Any], parent: str) -> str | None:
        """A parent's weights (`Lineage.load`); what a grown vocabulary did, to say."""
        return self.lineage.load(payload, parent)

    def validating(self, saved: SavedWeights) -> EncoderDecoder:
        """The model that holds the weights just `saved`, to validate: itself."""
        return self.model

    def holding(self, weights: dict[str, Tensor]) -> EncoderDecoder:
        """The model holding whole `weights` (at the end of training, an average's), to validate."""
        self.model.load_state_dict(weights)
        return self.model


class ShardedModel:
    """A model sharded over the processes (`shard_training`), its optimiser and its `lineage` (its recipe and
    tokenizers; a parent's weights), as the trainer saves, restores and validates them; every method is collective
    (all ranks call it) unless it says otherwise."""

    def __init__(self, lineage: Lineage, optimizer: torch.optim.Optimizer, *, distributed: Distributed) -> None:
        self.lineage, self.model, self.optimizer, self.distributed = lineage, lineage.model, optimizer, distributed
        self.run = RunFiles(lineage.config.run_path)
        self.device = next(self.model.parameters()).device  # this rank's (a sharded weight's is its shard's)

    def full_weights(self) -> dict[str, Tensor]:
        """The whole fp32 weights on the CPU, named as a plain model's; on rank 0 only (others get {})."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def save(self, step: int) -> SavedWeights:
        """Write update `step`'s model and optimiser shards to RUN/sharded/step_N (DCP: a file per rank) and gather
        the whole weights; last.pt, written by rank 0 with the returned record, makes the folder the one to resume."""
        import torch.distributed.checkpoint as dcp

        folder = self.run.sharded_step(step)
        if self.distributed.is_main and folder.exists():
            shutil.rmtree(folder)  # an interrupted write of this step (last.pt names an earlier one)
        barrier(self.distributed)
        # A new optimiser (fine-tuning's step 0) has no state, and saves none: DCP would make one by a step at
        # learning rate 0, which counts in Adam's bias correction
        state = self._state(optimizer=bool(self.optimizer.state))
        dcp.save(state, checkpoint_id=folder)
        record = {"folder": folder.relative_to(self.run.path).as_posix(), "processes": self.distributed.world_size}
        return SavedWeights(weights=self.full_weights(), record={"sharded": record | {"optimizer": "optimizer" in state}})

    def _state(self, *, optimizer: bool) -> dict[str, Any]:
        """The model's shards, and with `optimizer` the optimiser's, as DCP saves and loads them (by name)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        state = {"model": get_model_state_dict(self.model)}
        return state | ({"optimizer": get_optimizer_state_dict(self.model, self.optimizer)} if optimizer else {})

    def restore(self, payload: dict[str, Any], *, last: Path) -> None:
        """Read the model and optimiser shards that a last.pt `payload` (at `last`) names, written by as many
        processes as now."""
        record = payload.get("sharded")
        if record is None:
            raise MtkitError(f"{last}: written without sharding; resume it with train.shard=none (as it was trained)")
        if record["processes"] != self.distributed.world_size:
            raise MtkitError(
                f"{last}: written by {record['processes']} processes of train.shard=fsdp; resume it with torchrun "
                f"--nproc_per_node {record['processes']} (each process's batches and shards are its own)"
            )
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        state = self._state(optimizer=record["optimizer"])
        dcp.load(state, checkpoint_id=self.run.path / record["folder"])
        set_model_state_dict(self.model, state["model"])
        if record["optimizer"]:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])

    def load_parent(self, payload: dict[str, Any], parent: str) -> str | None:
        """A parent's weights (`finetune.parent_weights`), each rank keeping its share; what a grown vocabulary did."""
        config, tokenizers = self.lineage.config, self.lineage.tokenizers
        weights, said = parent_weights(self.model, payload, parent=parent, tokenizers=tokenizers, config=config)
        self.load_full_weights(weights, source=parent)
        return said

    def validating(self, saved: SavedWeights) -> EncoderDecoder:
        """On rank 0 alone: a plain model holding the whole weights just `saved`, to validate."""
        return self.holding(saved.weights)

    def holding(self, weights: dict[str, Tensor]) -> EncoderDecoder:
        """On rank 0 alone: a plain model holding whole `weights` on this rank's device, to validate."""
        config, tokenizers = self.lineage.config, self.lineage.tokenizers
        mismatch = f"{config.run_path}: the gathered weights do not fit the model"
        return model_with_weights(config.model, tokenizers, weights=weights, mismatch=mismatch).to(self.device)

    @torch.no_grad()
    def load_full_weights(self, weights: dict[str, Tensor], *, source: str) -> None:
        """Give the sharded model whole weights that every rank holds (those of `source`, a parent for fine-tuning):
        each rank keeps its share, with no communication. By hand, tensor by tensor: torch's set_model_state_dict
        fails on tied weights (as torch 2.13 does)."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        own = self.model.state_dict(keep_vars=True)
        misfit = next((name for name, tensor in own.items() if name not in weights or weights[name].shape != tensor.shape), None)
        misfit = misfit or next((name for name in weights if name not in own), None)
        if misfit is not None:
            raise MtkitError(f"{source}: its weights do not fit the recipe's model (first at {misfit})")
        for name, tensor in own.items():
            value = weights[name].to(tensor.device, tensor.dtype)
            if isinstance(tensor, DTensor):
                value = distribute_tensor(value, tensor.device_mesh, tensor.placements, src_data_rank=None)
            tensor.copy_(value)


def hold_model(
    lineage: Lineage, optimizer: torch.optim.Optimizer | MasterWeightOptimizer, *, distributed: Distributed
) -> WholeModel | ShardedModel:
    """How the trainer holds its model (`train.shard`): whole in each process, or sharded (the model already sharded
    by `shard_training`, its optimiser built over the shards)."""
    if lineage.config.train.shard != "fsdp":
        return WholeModel(lineage, optimizer)
    assert not isinstance(optimizer, MasterWeightOptimizer)  # train.bf16_weights is refused with FSDP
    return ShardedModel(lineage, optimizer, distributed=distributed)
