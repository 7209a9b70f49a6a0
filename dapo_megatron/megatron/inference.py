"""Rollout generation on a Megatron-Core GPTModel with a KV cache and our own decode loop.

The engine runs the model of ``megatron.model.build_model`` (the policy's own model object
when colocated, so no weight is copied, or a model of its own refitted from HF tensors)
with Megatron's ``StaticInferenceContext``: each attention layer appends this step's keys
and values to a preallocated ``[max_seq, batch, groups, head_dim]`` cache and attends over
the cached ones, so a decode step costs O(current length), not a recompute of the prefix.
(Megatron's dynamic engine needs flash-attn, so it is not an option on CPU.)

One ``generate`` call, for R = prompts x n rows:

1. rows are left-padded to the longest prompt P and prefilled in ONE forward. Pad tokens
   are masked as keys (an explicit boolean mask, causal | key-is-padding, which Megatron's
   local core attention applies as given). Megatron's rotary embedding has no per-row
   positions: a row with ``pad`` pad tokens sees positions ``pad..P-1`` instead of HF's
   ``0..L-1``. RoPE scores depend only on position DIFFERENCES, so this is exact in exact
   arithmetic and differs from HF at fp32 rounding level (measured in the tests).
2. decode token by token: sample from the last logits (temperature, top-k, then top-p on
   the renormalised top-k set; token_sampling.py), feed the tokens back, and mark a row
   ended on a stop token or its budget (``max_tokens``, or the context limit
   ``max_model_len``). A token's step reads nothing back to the host: which rows ended is
   kept on the device, and the host looks every ``DecodeOptions.check_every`` tokens (one
   sync), ending the batch, cutting its tail or dropping finished rows from the batch and
   the KV cache (compaction once an eighth of the rows is done), so long-running rows do
   not pay for finished ones. The decode forward is decode_step.StaticDecodeStep: fixed
   shapes over the whole cache with a key mask, replayed from a CUDA graph on one GPU.

During a call each attention layer's ``_adjust_key_value_for_inference`` is replaced (an
instance attribute, removed afterwards, like ``policy_step.hidden_state_head``) by one that
caches keys AFTER RoPE (decode_mode.py, with the call's other changes to the model):
Megatron's static path caches them before and re-rotates the whole cache at every step,
an O(T^2) recomputation that dominated CPU decoding.

Tensor parallelism: all TP ranks run the loop together on the same prompts; TP rank 0
samples and broadcasts its tokens and logprobs, so every rank returns identical samples
even if the ranks' logits differ in their last bits. Sequence parallelism is switched off
for the duration of a call (a one-token decode step cannot be split over the TP ranks)
and restored afterwards. Pipeline and context parallelism are not supported for
generation (NotImplementedError): on GPU the vLLM backend is the default engine.

Expert parallelism (a MoE with EP > 1): every forward dispatches tokens to the experts of
the other EP ranks, a collective of the EP group, and those ranks are the engines of other
data-parallel replicas, with prompts and stopping times of their own. They decode in
lockstep: before each forward every rank says whether it has one to run (one all-reduce
of a flag over the EP group), and a rank whose rows are done runs one-token idle forwards
until no peer has work left, so all EP ranks run the same number of forwards per
``generate`` call (that flag is read by the host: with EP > 1 a token's step keeps one
sync, and no CUDA graph). Every EP rank must call ``generate`` together (with no prompts if its
replica has none: the controller calls every replica).

Routing replay (a model built with ``policy.moe.routing_replay``): the routers RECORD
during ``generate`` and every sample carries the experts of each token fed to the model
(``Sample.routed_experts``, megatron/routing_replay.py); routing happens before the
expert dispatch, so each EP rank records its own rows.

Transformer Engine's attention ignores explicit masks during decode; with it (or with
fused masked softmax kernels) rows are grouped by prompt length instead, so no padding
and no mask are needed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from megatron.core import parallel_state
from megatron.core.inference.contexts import StaticInferenceContext

from dapo_megatron.config.model_arch import ModelArch
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.device import collectives
from dapo_megatron.megatron.decode_mode import (
    compact_cache,
    honours_padding_mask,
    rng_forks_off,
    rotate_before_caching,
    sequence_parallel_off,
)
from dapo_megatron.megatron.decode_step import DecodeOptions, StaticDecodeStep
from dapo_megatron.megatron.hf_weights import load_hf_checkpoint, load_hf_tensors
from dapo_megatron.megatron.model import build_model, unwrap_model
from dapo_megatron.megatron.routing_replay import RoutingLog, RoutingRecorder
from dapo_megatron.megatron.tail_cut import TailCut
from dapo_megatron.megatron.token_sampling import sample_next_tokens
from dapo_megatron.refit.buckets import BucketLayout
from dapo_megatron.refit.group import GroupAddress
from dapo_megatron.refit.receiver import EngineReceiver
from dapo_megatron.refit.stats import TransferStats
from dapo_megatron.shared.sampling import FinishReason, Sample, SamplingParams

# Drop finished rows from the KV cache once this fraction of its rows is finished: a
# compaction copies the cache once (about one decode step's attention traffic), so the
# overhead stays bounded while at most this fraction of every step is wasted.
_COMPACT_FRACTION = 1 / 8


@dataclass
class _Decoded:
    """The outcome of one decoded batch; row b's response is ``tokens[b, :lengths[b]]``."""

    tokens: torch.Tensor
    """[B, T] int64 sampled tokens (entries past a row's length are meaningless)."""
    logprobs: torch.Tensor
    """[B, T] fp32 logprob of each sampled token at the sampling temperature."""
    lengths: torch.Tensor
    """[B] int64 response lengths."""
    stopped: torch.Tensor
    """[B] bool: ended on a stop token (else: reached its budget)."""
    aborted: torch.Tensor
    """[B] bool: still running when the call stopped (``finish_after_fraction``)."""
    routing: RoutingLog | None = None
    """The experts of every fed token (routing replay only)."""

    def on_host(self) -> _Decoded:
        """The same outcome with its tensors on the CPU: one copy per field, instead of
        a device read per row and field when the samples are built."""
        return _Decoded(
            self.tokens.cpu(),
            self.logprobs.cpu(),
            self.lengths.cpu(),
            self.stopped.cpu(),
            self.aborted.cpu(),
            self.routing,
        )


class MegatronGenerationBackend:
    """``GenerationBackend`` on a Megatron-Core GPTModel (see the module docstring).

    Every method is collective over the model's TP group: all its ranks call it together
    with the same arguments, and all return the same samples. Data-parallel replicas are
    independent engines.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        arch: ModelArch,
        dims: ParallelDims,
        *,
        shares_policy_model: bool = False,
        max_batch_size: int | None = None,
        max_model_len: int | None = None,
        refit_device: str = "cpu",
        decode: DecodeOptions | None = None,
    ) -> None:
        """Wrap this rank's model (requires ``initialize_parallel``).

        Args:
            model: this rank's GPTModel from ``build_model(arch, dims, ...)``, possibly
                wrapped in DDP / Float16Module (the policy's ``model[0]``).
            arch: the model's architecture.
            dims: the layout the model was built with; pp and cp must be 1.
            shares_policy_model: ``model`` is the policy's own model object, so the engine
                always sees the current weights and ``update_weights`` copies nothing.
            max_batch_size: most rows (prompts x n) decoded together; None: all of them.
            max_model_len: longest prompt + response; default the model's
                ``max_position_embeddings``. A row that reaches it finishes with "length".
            refit_device: where a refit's received buckets land (the run plan's device);
                an engine of its own only (``receive_weights``).
            decode: how the decode loop runs (decode_step.DecodeOptions; default its
                defaults: host checks every 16 tokens, static cache, CUDA graphs).

        Raises:
            NotImplementedError: pipeline or context parallelism.
        """
        if dims.pp > 1 or dims.cp > 1:
            raise NotImplementedError(
                f"Megatron generation supports tensor parallelism only (got pp={dims.pp}, "
                f"cp={dims.cp}): give the generation engine pp=1 and cp=1, or use the vllm "
                f"backend"
            )
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._model: torch.nn.Module | None = unwrap_model(model)
        self._arch = arch
        self._dims = dims
        self._shares_policy_model = shares_policy_model
        self._max_batch_size = max_batch_size
        self._max_model_len = max_model_len or arch.max_position_embeddings
        self._padding_mask_ok = honours_padding_mask(self._model)
        self._recorder = RoutingRecorder.of(self._model)
        # The group whose ranks must run their forwards in lockstep (see the module doc).
        self._lockstep_group = (
            parallel_state.get_expert_model_parallel_group()
            if arch.moe is not None and dims.ep > 1
            else None
        )
        # The engine's end of a collective refit: one weight-group member (TP1 engine).
        self._receiver = EngineReceiver(refit_device)
        self._options = decode or DecodeOptions()
        self._on_cuda = next(self._model.parameters()).is_cuda
        self._graph_pool: Any = None

    @classmethod
    def from_hf_checkpoint(
        cls,
        hf_dir: str | Path,
        arch: ModelArch,
        dims: ParallelDims,
        precision: str,
        **kwargs: Any,
    ) -> MegatronGenerationBackend:
        """An engine with a model of its own, built for ``dims`` and loaded from ``hf_dir``."""
        model = build_model(arch, dims, precision)
        load_hf_checkpoint(model, hf_dir, arch, dims)
        return cls(model, arch, dims, **kwargs)

    # ----------------------------------------------------------------------------------
    # GenerationBackend

    def generate(
        self, prompts_token_ids: list[list[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """Sample ``sampling.n`` responses for each prompt; ``out[i][j]`` is sample j of i.

        All prompts x n rows are decoded in as few batches as possible (one, unless
        ``max_batch_size`` or a mask-less attention forces more).

        Raises:
            ValueError: an empty prompt, a token id outside the vocabulary, or a prompt
                that leaves no room for a response within ``max_model_len``.
        """
        model = self._check_open()
        self._validate_prompts(prompts_token_ids)
        rows = [p for p in prompts_token_ids for _ in range(sampling.n)]
        caps = sampling.response_caps(len(prompts_token_ids))
        budgets = [
            min(caps[r // sampling.n], self._max_model_len - len(p)) for r, p in enumerate(rows)
        ]
        device = next(model.parameters()).device
        generator = torch.Generator(device=device)
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
        samples: list[Sample | None] = [None] * len(rows)
        tail = TailCut(len(prompts_token_ids), sampling.n, sampling.finish_target)
        recording = self._recorder.recording() if self._recorder else contextlib.nullcontext()
        with self._inference(model), recording:
            for batch in self._plan_batches([len(r) for r in rows]):
                if tail.reached():  # the call has its finished groups: never started
                    for row in batch:
                        samples[row] = Sample([], [], "abort")
                    continue
                decoded = self._decode(
                    model,
                    [rows[i] for i in batch],
                    [budgets[i] for i in batch],
                    sampling,
                    generator,
                    tail.check(batch) if tail.target is not None else None,
                )
                decoded = decoded.on_host()
                tail.finish(batch, decoded.lengths > 0)
                for b, row in enumerate(batch):
                    sample = samples[row] = _to_sample(decoded, b, sampling.logprobs)
                    if decoded.routing is not None:
                        sample.routed_experts = decoded.routing.sample(
                            b, len(rows[row]), sample.response_length
                        )
            while self._peers_busy(False):
                self._idle_forward(model)
        self._graph_pool = None  # the call's graphs are gone: their memory may go too
        done = [sample for sample in samples if sample is not None]
        assert len(done) == len(samples), "every row ends with a sample"
        n = sampling.n
        return [done[i * n : (i + 1) * n] for i in range(len(prompts_token_ids))]

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full HF-named tensors (e.g. ``export_hf_weights`` of the policy).

        With ``shares_policy_model`` the engine's parameters ARE the policy's, so there is
        nothing to copy and ``weights`` is not iterated (a generator is closed unstarted:
        the export's collectives then run on no rank, consistently). Otherwise each
        tensor is sharded into this rank's model (``hf_weights.load_hf_tensors``); the
        iterator must then be consumed by every rank that produces it.
        """
        model = self._check_open()
        if self._shares_policy_model:
            close = getattr(weights, "close", None)
            if close is not None:
                close()
            return
        load_hf_tensors(model, weights, self._arch, self._dims)

    num_weight_ranks = 1
    """Members this engine adds to a weight-update group: its one process."""

    def join_weight_group(
        self, address: GroupAddress, rank_offset: int, transport: RefitTransport
    ) -> list[int]:
        """Join the weight-update group as ``rank_offset`` for ``transport``; the ranks
        taken."""
        self._receiver.join(address, rank_offset, transport)
        return [rank_offset]

    def attach_shared(self, handles: list[bytes]) -> None:
        """ipc transport: map the buffer of the policy rank paired with this engine."""
        self._receiver.attach(handles[0])

    def receive_weights(self, layout: BucketLayout) -> list[dict[str, float]]:
        """Receive one refit's buckets into the model in place, tensor by tensor as they
        arrive; the transfer stats of the engine's one process."""
        stats = TransferStats()
        self.update_weights(self._receiver.receive(layout, stats))
        self._receiver.check_complete(layout, stats)
        return [stats.as_report()]

    def sleep(self) -> None:
        """No-op on CPU. KV caches live only inside ``generate``; on GPU their freed
        blocks are handed back to the driver so that the colocated trainer can use them."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """No-op: ``sleep`` releases nothing that must be restored."""

    def shutdown(self) -> None:
        """Drop the engine's reference to the model and leave the weight group; further
        calls raise RuntimeError."""
        self._receiver.close()
        self._model = None

    # ----------------------------------------------------------------------------------
    # Internals

    @property
    def _static_cache(self) -> bool:
        """Decode with the static step (decode_step.DecodeOptions.static_cache)."""
        return self._options.static_cache and self._padding_mask_ok

    @property
    def _graphs(self) -> bool:
        """Replay the static step from CUDA graphs: where the captured step is known to be
        fixed: one rank (no collective in the forward), a dense model (MoE dispatch sizes
        its buffers on the host), no routing recorder (Python-side records per forward),
        no EP lockstep."""
        return (
            self._options.cuda_graphs
            and self._static_cache
            and self._on_cuda
            and self._dims.tp == 1
            and self._arch.moe is None
            and self._recorder is None
            and self._lockstep_group is None
        )

    @property
    def _compact_fraction(self) -> float:
        """A graphed batch is captured again after each compaction: compact less often."""
        if self._options.compact_fraction is not None:
            return self._options.compact_fraction
        return 1 / 2 if self._graphs else _COMPACT_FRACTION

    def _check_open(self) -> torch.nn.Module:
        if self._model is None:
            raise RuntimeError("the generation backend was shut down")
        return self._model

    def _validate_prompts(self, prompts: list[list[int]]) -> None:
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty: generation needs at least one token")
            if min(prompt) < 0 or max(prompt) >= self._arch.vocab_size:
                raise ValueError(
                    f"prompt {i} has token ids outside [0, "
                    f"{self._arch.vocab_size}): {min(prompt)}..{max(prompt)}"
                )
            if len(prompt) >= self._max_model_len:
                raise ValueError(
                    f"prompt {i} has {len(prompt)} tokens: no room for a response "
                    f"within max_model_len={self._max_model_len}"
                )

    def _plan_batches(self, lengths: list[int]) -> list[list[int]]:
        """Row indices of each decoded batch: sorted by prompt length (less padding), one
        length per batch when the attention cannot mask padding, at most max_batch_size."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        groups: list[list[int]] = []
        for row in order:
            if groups and (self._padding_mask_ok or lengths[groups[-1][0]] == lengths[row]):
                groups[-1].append(row)
            else:
                groups.append([row])
        size = self._max_batch_size
        return [g[i : i + size] for g in groups for i in range(0, len(g), size)] if size else groups

    @contextlib.contextmanager
    def _inference(self, model: torch.nn.Module) -> Iterator[None]:
        """Eval mode, no autograd, no sequence parallelism, RoPE before the KV cache; the
        model is restored afterwards (the policy may be mid-training when colocated)."""
        was_training = model.training
        model.eval()
        try:
            with (
                torch.no_grad(),
                sequence_parallel_off(model),
                rotate_before_caching(model),
                rng_forks_off(),
            ):
                yield
        finally:
            model.train(was_training)

    def _forward(
        self,
        model: torch.nn.Module,
        tokens_BS: torch.Tensor,
        start: int,
        pad_BK: torch.Tensor | None,
        context: StaticInferenceContext,
    ) -> torch.Tensor:
        """Logits [B, vocab] fp32 of the last position, for tokens at positions
        ``start..start+S-1``; the K/V of those positions are appended to the cache."""
        self._peers_busy(True)
        b, s = tokens_BS.shape
        positions = torch.arange(start, start + s, device=tokens_BS.device).expand(b, s)
        mask = None
        if pad_BK is not None:
            # [B, 1, S, start+S], True = masked: padding keys, and future keys in prefill.
            mask = pad_BK[:, None, None, : start + s].expand(b, 1, s, start + s)
            if s > 1:
                causal = torch.ones(s, start + s, dtype=torch.bool, device=pad_BK.device)
                mask = mask | causal.triu(start + 1)
        logits = model(
            tokens_BS, positions, mask, inference_context=context, runtime_gather_output=True
        )
        context.increment_sequence_len_offset(s)
        last: torch.Tensor = logits[:, -1, : self._arch.vocab_size].float()
        return last

    def _peers_busy(self, busy: bool) -> bool:
        """Whether any rank of the lockstep group has a forward to run (``busy``: this rank
        has); False at once without expert parallelism. Called before every forward."""
        if self._lockstep_group is None:
            return False
        flag = torch.tensor([int(busy)], device=next(self._check_open().parameters()).device)
        collectives.all_reduce(flag, op=collectives.MAX, group=self._lockstep_group)
        return bool(flag.item())

    def _idle_forward(self, model: torch.nn.Module) -> None:
        """A one-token forward whose output is dropped: this rank's share of a peer's
        forward (the experts' token exchange), when it has no row of its own to decode."""
        device = next(model.parameters()).device
        token = torch.zeros(1, 1, dtype=torch.long, device=device)
        context = StaticInferenceContext(1, 1)
        model(token, token, None, inference_context=context, runtime_gather_output=True)

    def _decode(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        budgets: list[int],
        sampling: SamplingParams,
        generator: torch.Generator,
        enough: Callable[[torch.Tensor], bool] | None = None,
    ) -> _Decoded:
        """Prefill one batch of rows and decode it to completion, or until ``enough``
        (given the rows finished so far, [B] bool) says the call has what it needs: the
        rows still running are then aborted with the tokens they have. ``enough`` sees
        only sampled tokens, which every TP rank shares, so the ranks stop together.

        A token's step reads nothing back to the host: whether rows ended is kept on the
        device, and the host looks (one sync) every ``check_every`` tokens; every TP rank
        looks at the same steps, so they decide alike."""
        device = generator.device
        batch = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        prompt_len, steps = int(lengths.max()), max(budgets)
        tokens = torch.zeros(batch, prompt_len, dtype=torch.long, device=device)
        for b, prompt in enumerate(prompts):
            tokens[b, prompt_len - len(prompt) :] = torch.tensor(prompt, device=device)
        pad_BK = None
        if int(lengths.min()) < prompt_len:
            pad_BK = torch.zeros(batch, prompt_len + steps, dtype=torch.bool, device=device)
            pad_BK[:, :prompt_len] = (
                torch.arange(prompt_len, device=device) < (prompt_len - lengths)[:, None]
            )
        context = StaticInferenceContext(batch, prompt_len + steps)
        logits = self._forward(model, tokens, 0, pad_BK, context)
        context.enable_decode_mode()
        routing = None
        if self._recorder is not None:
            routing = self._recorder.new_log(batch, prompt_len, prompt_len + steps, device)
            routing.prefill()

        out = _Decoded(
            tokens=torch.zeros(batch, steps, dtype=torch.long, device=device),
            logprobs=torch.zeros(batch, steps, dtype=torch.float32, device=device),
            lengths=torch.zeros(batch, dtype=torch.long, device=device),
            stopped=torch.zeros(batch, dtype=torch.bool, device=device),
            aborted=torch.zeros(batch, dtype=torch.bool, device=device),
            routing=routing,
        )
        budget_B = torch.tensor(budgets, device=device)
        stop_ids = torch.tensor(sampling.stop_token_ids, dtype=torch.long, device=device)
        rows = torch.arange(batch, device=device)  # cache row -> batch row
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        key_mask = None
        if self._static_cache:
            key_mask = torch.ones(batch, prompt_len + steps, dtype=torch.bool, device=device)
            key_mask[:, :prompt_len] = False if pad_BK is None else pad_BK[:, :prompt_len]
        step_fn = self._decode_step(model, context, prompt_len, key_mask, pad_BK)
        # Short budgets look more often: the wasted tail stays under an eighth of one.
        check_every = max(1, min(self._options.check_every, steps // 8))
        for step in range(steps):
            next_tok, next_lp = self._sample_on_tp_rank0(logits, sampling, generator)
            out.tokens[rows, step] = next_tok
            out.logprobs[rows, step] = next_lp
            hit_stop = (next_tok[:, None] == stop_ids).any(dim=1)
            finished = alive & (hit_stop | (budget_B[rows] <= step + 1))
            out.lengths[rows] = torch.where(finished, step + 1, out.lengths[rows])
            out.stopped[rows] = out.stopped[rows] | (finished & hit_stop)
            alive &= ~finished
            if (step + 1) % check_every == 0 or step + 1 == steps:
                num_alive = int(alive.sum())  # the host's look: one sync per check_every
                if num_alive == 0:
                    break
                if enough is not None and num_alive < len(rows) and enough(out.lengths > 0):
                    cut = rows[alive]
                    out.lengths[cut] = step + 1
                    out.aborted[cut] = True
                    break
                if len(rows) - num_alive >= max(1, int(len(rows) * self._compact_fraction)):
                    keep = alive.nonzero().squeeze(1)
                    compact_cache(context, keep)
                    rows, alive, next_tok = rows[keep], alive[keep], next_tok[keep]
                    pad_BK = None if pad_BK is None else pad_BK[keep]
                    key_mask = None if key_mask is None else key_mask[keep]
                    step_fn.close()
                    # next_tok goes to column prompt_len + step, as without compaction.
                    step_fn = self._decode_step(model, context, prompt_len + step, key_mask, pad_BK)
            logits = step_fn(next_tok)
            if routing is not None:
                routing.step(rows, prompt_len + step)
        step_fn.close()
        return out

    def _decode_step(
        self,
        model: torch.nn.Module,
        context: StaticInferenceContext,
        column: int,
        key_mask: torch.Tensor | None,
        pad_BK: torch.Tensor | None,
    ) -> _Step:
        """The forward of one decode token for the batch of ``context``: the static step
        (fixed buffers; a CUDA graph where eligible) or the growing one."""

        def forward(
            tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
        ) -> torch.Tensor:
            # Each forward says it is busy once, as _forward does for prefill and the growing
            # step (a no-op without EP lockstep, so nothing of it enters a CUDA graph).
            self._peers_busy(True)
            logits = model(
                tokens, positions, mask, inference_context=context, runtime_gather_output=True
            )
            last: torch.Tensor = logits[:, -1, : self._arch.vocab_size].float()
            return last

        if key_mask is not None:
            pool = None
            if self._graphs:
                if self._graph_pool is None:
                    self._graph_pool = torch.cuda.graph_pool_handle()
                pool = self._graph_pool
            return StaticDecodeStep(forward, context, column, key_mask, graph_pool=pool)
        return _GrowingStep(self, model, context, pad_BK)

    def _sample_on_tp_rank0(
        self, logits_BV: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample on TP rank 0 and give its tokens and logprobs to every TP rank.

        The TP ranks' gathered logits agree only up to the reduction order of their
        all-reduces; one broadcast per step makes the choice (and the cache) identical.
        """
        if self._dims.tp == 1:
            return sample_next_tokens(logits_BV, sampling, generator)
        packed = torch.empty(logits_BV.shape[0], 2, dtype=torch.float64, device=logits_BV.device)
        if parallel_state.get_tensor_model_parallel_rank() == 0:
            tokens, logprobs = sample_next_tokens(logits_BV, sampling, generator)
            # float64 holds every token id (< 2**53) and every fp32 logprob exactly.
            packed[:, 0], packed[:, 1] = tokens, logprobs
        collectives.broadcast(
            packed,
            src=parallel_state.get_tensor_model_parallel_src_rank(),
            group=parallel_state.get_tensor_model_parallel_group(),
        )
        return packed[:, 0].long(), packed[:, 1].float()


class _Step(Protocol):
    """One decode token's forward: the logits [B, V] after feeding tokens [B]."""

    def __call__(self, tokens_B: torch.Tensor) -> torch.Tensor: ...

    def close(self) -> None: ...


class _GrowingStep:
    """The decode step over the cache filled so far (its length grows by one per token):
    for core attentions that ignore an explicit key mask (Transformer Engine, fused
    softmax), where the static step's hidden columns would not stay hidden."""

    def __init__(
        self,
        engine: MegatronGenerationBackend,
        model: torch.nn.Module,
        context: StaticInferenceContext,
        pad_BK: torch.Tensor | None,
    ) -> None:
        self._engine, self._model, self._context, self._pad_BK = engine, model, context, pad_BK

    def __call__(self, tokens_B: torch.Tensor) -> torch.Tensor:
        start = self._context.sequence_len_offset
        return self._engine._forward(
            self._model, tokens_B[:, None], start, self._pad_BK, self._context
        )

    def close(self) -> None:
        """Nothing to release."""


def _to_sample(decoded: _Decoded, row: int, with_logprobs: bool) -> Sample:
    length = int(decoded.lengths[row])
    reason: FinishReason = "stop" if bool(decoded.stopped[row]) else "length"
    return Sample(
        response_token_ids=decoded.tokens[row, :length].tolist(),
        logprobs=decoded.logprobs[row, :length].tolist() if with_logprobs else [],
        finish_reason="abort" if bool(decoded.aborted[row]) else reason,
    )
