"""What the checkpoint tests' rank processes share (test_checkpoint*.py): a tiny HF model,
one rank's DDP policy with its optimizer and scheduler, the data stream and the RNG draws.

Megatron is imported inside the functions only (the pytest process never needs it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from dapo_megatron.config.model_arch import ModelArch, arch_from_hf_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.schema_policy import OptimizerConfig, SchedulerConfig

SEQ, MICRO_BATCHES = 16, 2
TOTAL_STEPS, SAVE_AT = 4, 2
OPTIMIZER = OptimizerConfig(
    name="adam",
    lr=3e-3,
    min_lr=3e-4,
    weight_decay=0.01,
    adam_beta1=0.9,
    adam_beta2=0.95,
    adam_eps=1e-8,
    clip_grad=1.0,
)
# Warm-up then cosine decay: the resumed run must also restore the schedule's position.
SCHEDULER = SchedulerConfig(
    lr_warmup_steps=2, lr_warmup_init=3e-4, lr_decay_style="cosine", lr_decay_steps=None
)


def layout(tp: int = 1, pp: int = 1, dp: int = 1) -> ParallelDims:
    return ParallelDims(tp=tp, pp=pp, cp=1, dp=dp, sequence_parallel=False)


@dataclasses.dataclass(frozen=True)
class TinyModel:
    hf_dir: str
    arch: ModelArch


def make_tiny_model(directory: Path) -> TinyModel:
    """A tiny random Qwen2 saved as an HF checkpoint under ``directory``."""
    # Imported here: the rank processes import this module too and never need it.
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # HF inits biases to 0 and norms to 1: random values exercise every mapping.
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
    hf_dir = directory / "qwen2"
    model.save_pretrained(hf_dir)
    return TinyModel(str(hf_dir), arch_from_hf_config(config.to_dict(), "test qwen2"))


# --------------------------------------------------------------- rank-side helpers


class RankPolicy:
    """One rank's DDP model, optimizer and scheduler, built from the HF checkpoint."""

    def __init__(
        self,
        tiny: TinyModel,
        dims: ParallelDims,
        distributed_optimizer: bool,
        optimizer_name: str = "adam",
    ):
        from dapo_megatron.megatron.hf_weights import load_hf_checkpoint
        from dapo_megatron.megatron.model import build_model
        from dapo_megatron.megatron.optimizer import build_optimizer, build_scheduler, wrap_ddp

        self.tiny, self.dims = tiny, dims
        module = build_model(tiny.arch, dims, "fp32")
        load_hf_checkpoint(module, tiny.hf_dir, tiny.arch, dims)
        self.model = [
            wrap_ddp(module, module.config, use_distributed_optimizer=distributed_optimizer)
        ]
        self.optimizer = build_optimizer(
            self.model,
            dataclasses.replace(OPTIMIZER, name=optimizer_name),
            precision="fp32",
            use_distributed_optimizer=distributed_optimizer,
        )
        self.scheduler = build_scheduler(
            self.optimizer, OPTIMIZER, SCHEDULER, total_optimizer_steps=TOTAL_STEPS
        )

    def train_step(self, step: int) -> float | None:
        """One optimizer step on the batch of ``step``; the mean loss on the last stage."""
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(
            data: Iterator[torch.Tensor], model: torch.nn.Module
        ) -> tuple[torch.Tensor, Callable]:
            tokens = next(data)
            inputs, labels = tokens[:, :-1], tokens[:, 1:]
            positions = torch.arange(inputs.shape[1]).expand_as(inputs)
            logits = model(inputs, positions, None)

            def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict]:
                loss = tensor_parallel.vocab_parallel_cross_entropy(output.float(), labels).mean()
                return loss, {"loss": loss.detach()}

            return logits, loss_func

        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(step_batch(step).split(1)),
            model=self.model,
            num_microbatches=MICRO_BATCHES,
            seq_length=SEQ,
            micro_batch_size=1,
            forward_only=False,
        )
        finalize_model_grads(self.model)
        updated, _, _ = self.optimizer.step()
        assert updated
        self.scheduler.step(increment=1)
        if not parallel_state.is_pipeline_last_stage():
            return None
        return torch.stack([o["loss"] for o in outputs]).mean().item()

    def hf_weights(self) -> dict[str, torch.Tensor]:
        from dapo_megatron.megatron.hf_weights import export_hf_weights

        return dict(export_hf_weights(self.model[0], self.tiny.arch, self.dims))


def step_batch(step: int) -> torch.Tensor:
    """[micro-batches, SEQ + 1] tokens of this DP rank for ``step``: the data stream.

    A function of (step, DP rank) only, like a dataloader restored to its position: a
    resumed run and a run on another layout see the same samples.
    """
    from megatron.core import parallel_state

    generator = torch.Generator().manual_seed(1000 * step + parallel_state.get_data_parallel_rank())
    return torch.randint(0, 160, (MICRO_BATCHES, SEQ + 1), generator=generator)


def rng_draws() -> dict[str, object]:
    """One draw from each RNG stream a checkpoint restores (Megatron's tracker: its states,
    since a draw inside ``fork()`` on CPU trips Megatron's CPU-RNG-changed warning)."""
    import random

    import numpy as np
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker().get_states()
    return {
        "python": random.random(),
        "numpy": np.random.rand(3),
        "torch": torch.rand(3),
        "tracker": {name: state.clone() for name, state in tracker.items()},
    }


def scramble_rng() -> None:
    """Move every RNG stream elsewhere: only a restore brings them back to the saved ones."""
    import random

    import numpy as np
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    model_parallel_cuda_manual_seed(99)


def init_ranks(dims: ParallelDims) -> None:
    from dapo_megatron.megatron.distributed import initialize_parallel

    initialize_parallel(dims, seed=1234)
