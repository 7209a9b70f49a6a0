"""The Megatron engine's decode loop on a GPU's terms, checked on the CPU (one rank, gloo).

What a CUDA device would do differently is counted or emulated, not timed:

* host syncs: ``HostSyncCounter`` (device/host_syncs.py) counts every op that would make
  the host wait for the device. Between two budgets of the same batch (no stop token:
  every row runs to its budget) the count grows by one per ``check_every`` tokens: the
  host's periodic look; the token step itself (sampling and forward) counts 0. The old
  per-token look (``check_every=1``) counts one per token: the counter sees what it must.
* a CUDA graph replays fixed kernels with fixed arguments: two consecutive static steps
  must run the same aten ops with the same shapes and the same non-tensor arguments (the
  growing step, whose cache slice grows, fails that check: the check can fail);
* the graph path's control flow (warm-up, one capture per batch, a replay per token) with
  ``torch.cuda.CUDAGraph`` emulated by a recording that re-runs the step on replay;
* the static step against the growing one: the same samples, with stop tokens and
  compaction, and with fresh cache memory full of NaN (what a GPU's allocator may hand
  out: the masked columns must weigh exactly nothing).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import transformers
from launch import run_distributed

from dapo_megatron.config.model_arch import ModelArch, arch_from_hf_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.shared.sampling import SamplingParams

pytestmark = pytest.mark.distributed

PROMPTS = [[5, 17, 3, 44, 9, 12], [61], [2, 30, 7], [8, 1, 70, 33, 21, 9, 4, 50, 13]]
STOP_IDS = list(range(0, 96, 32))  # 3 of 96: some rows stop early, some run to the cap
DIMS = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)


def _tiny(root: Path) -> tuple[str, ModelArch]:
    config = transformers.Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=320,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for _, param in model.named_parameters():
            param.copy_(0.2 * torch.randn_like(param))
    model.save_pretrained(root)
    return str(root), arch_from_hf_config(config.to_dict(), "qwen2 test config")


def _samples(groups) -> list:
    return [[(s.response_token_ids, s.logprobs, s.finish_reason) for s in g] for g in groups]


def _engine(model, arch, **options):
    from dapo_megatron.megatron.decode_step import DecodeOptions
    from dapo_megatron.megatron.inference import MegatronGenerationBackend

    return MegatronGenerationBackend(model, arch, DIMS, decode=DecodeOptions(**options))


def _syncs(engine, tokens: int) -> dict:
    from dapo_megatron.device.host_syncs import HostSyncCounter

    sampling = SamplingParams(temperature=1.0, max_tokens=tokens, n=2, seed=3)
    with HostSyncCounter() as counter:
        engine.generate(PROMPTS, sampling)
    return {"total": counter.total, "kinds": dict(counter.by_kind), "ops": counter.ops}


def _step_trace(step, tokens_B) -> list:
    """The aten ops of one decode step: name, tensor shapes/dtypes, other arguments."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def describe(value):
        if isinstance(value, torch.Tensor):
            return ("T", tuple(value.shape), str(value.dtype))
        if isinstance(value, (list, tuple)):
            return tuple(describe(v) for v in value)
        return value

    trace: list = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            trace.append((str(func), describe(args), describe(sorted(kwargs.items()))))
            return func(*args, **kwargs)

    with Record():
        step(tokens_B)
    return trace


class _RecordedGraph:
    """``torch.cuda.CUDAGraph`` on a CPU: capture runs the step once (keeping its output
    tensor, as a graph keeps its output buffer); replay runs it again and writes into that
    buffer. Counts captures and replays."""

    captures = 0
    replays = 0

    def __init__(self) -> None:
        self.fn = None
        self.out = None

    def replay(self) -> None:
        type(self).replays += 1
        self.out.copy_(self.fn())


class _Stream:
    """A CUDA stream on a CPU: one queue, nothing to order."""

    def wait_stream(self, other: object) -> None:
        """Nothing runs ahead on a CPU."""


def _graph_path(model, arch) -> dict:
    """Run the graph path with CUDA emulated; its samples, captures and replays."""
    from dapo_megatron.megatron import decode_step

    engine = _engine(model, arch)
    real_run = decode_step.StaticDecodeStep._run

    @contextlib.contextmanager
    def capture(graph, pool=None):
        _RecordedGraph.captures += 1
        step = capturing[-1]
        graph.fn = lambda: real_run(step)
        yield
        graph.out = step._logits

    capturing: list = []

    def run(step):
        capturing.append(step)
        return real_run(step)

    patches = [
        (decode_step.StaticDecodeStep, "_run", run),
        (torch.cuda, "CUDAGraph", _RecordedGraph),
        (torch.cuda, "graph", capture),
        (torch.cuda, "Stream", _Stream),
        (torch.cuda, "stream", lambda s: contextlib.nullcontext()),
        (torch.cuda, "current_stream", _Stream),
        (torch.cuda, "graph_pool_handle", lambda: "pool"),
    ]
    saved = [(o, n, getattr(o, n)) for o, n, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        engine._on_cuda = True  # the engine's one GPU fact; the rest is eligibility
        graphed = engine._graphs
        sampling = SamplingParams(
            temperature=0.8, max_tokens=40, n=3, seed=5, stop_token_ids=STOP_IDS
        )
        out = _samples(engine.generate(PROMPTS, sampling))
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
    return {
        "graphed": graphed,
        "samples": out,
        "captures": _RecordedGraph.captures,
        "replays": _RecordedGraph.replays,
    }


def _worker(hf_dir: str, arch: ModelArch) -> dict:
    from megatron.core.transformer.attention import Attention

    from dapo_megatron.megatron.distributed import initialize_parallel
    from dapo_megatron.megatron.hf_weights import load_hf_checkpoint
    from dapo_megatron.megatron.model import build_model

    initialize_parallel(DIMS, seed=1)
    model = build_model(arch, DIMS, "fp32")
    load_hf_checkpoint(model, hf_dir, arch, DIMS)
    out: dict = {}
    for name, options in {
        "static_k16": dict(check_every=16),
        "growing_k1": dict(check_every=1, static_cache=False),
    }.items():
        engine = _engine(model, arch, **options)
        out[name] = {n: _syncs(engine, n) for n in (128, 256)}

    sampled = SamplingParams(temperature=0.8, max_tokens=40, n=3, seed=5, stop_token_ids=STOP_IDS)
    greedy = SamplingParams(top_k=1, max_tokens=40)
    growing = _engine(model, arch, static_cache=False)
    out["growing"] = _samples(growing.generate(PROMPTS, sampled))
    out["static"] = _samples(_engine(model, arch).generate(PROMPTS, sampled))
    # The graph path compacts at half the rows done: its eager twin, for the comparison.
    out["static_half"] = _samples(
        _engine(model, arch, compact_fraction=0.5).generate(PROMPTS, sampled)
    )
    out["greedy"] = {
        k: _samples(_engine(model, arch, check_every=k).generate(PROMPTS, greedy))
        for k in (1, 4, 16)
    }
    # Fresh cache memory full of NaN (a GPU allocator's leftovers may be anything).
    allocate = Attention._allocate_memory

    def poisoned(self, *args, **kwargs):
        return allocate(self, *args, **kwargs).fill_(float("nan"))

    Attention._allocate_memory = poisoned
    try:
        out["static_nan_memory"] = _samples(_engine(model, arch).generate(PROMPTS, sampled))
    finally:
        Attention._allocate_memory = allocate
    out["graph"] = _graph_path(model, arch)

    # Two consecutive decode steps of each kind, traced.
    from megatron.core.inference.contexts import StaticInferenceContext

    from dapo_megatron.megatron.decode_step import StaticDecodeStep

    engine = _engine(model, arch)
    traces = {}
    with engine._inference(engine._model):
        for kind in ("static", "growing"):
            context = StaticInferenceContext(2, 16)
            engine._forward(engine._model, torch.tensor([[3, 4, 5], [6, 7, 8]]), 0, None, context)
            context.enable_decode_mode()
            mask = torch.ones(2, 16, dtype=torch.bool)
            mask[:, :3] = False
            step = (
                engine._decode_step(engine._model, context, 3, mask, None)
                if kind == "static"
                else engine._decode_step(engine._model, context, 3, None, None)
            )
            assert isinstance(step, StaticDecodeStep) == (kind == "static")
            tok = torch.tensor([9, 10])
            traces[kind] = [_step_trace(step, tok), _step_trace(step, tok)]
            step.close()
    out["traces_equal"] = {k: a == b for k, (a, b) in traces.items()}
    out["trace_len"] = len(traces["static"][0])
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    hf_dir, arch = _tiny(tmp_path_factory.mktemp("decode") / "qwen2")
    return run_distributed(_worker, 1, hf_dir, arch, timeout=300)[0]


def test_host_syncs_per_token(results):
    static, old = results["static_k16"], results["growing_k1"]
    extra_tokens = 256 - 128
    # One look per 16 tokens and nothing else per token: 128 more tokens, 8 more syncs.
    assert static[256]["total"] - static[128]["total"] == extra_tokens // 16, static
    # The per-token look of check_every=1 is seen, once per token: the counter can fail.
    assert old[256]["total"] - old[128]["total"] >= extra_tokens, old
    print(
        f"host syncs per token: {(static[256]['total'] - static[128]['total']) / extra_tokens} "
        f"(check_every=16), {(old[256]['total'] - old[128]['total']) / extra_tokens} (per token)"
    )


def test_static_step_is_replayable(results):
    # The same ops, shapes and arguments at two positions: what one graph replays.
    assert results["traces_equal"]["static"], "the static step changes between tokens"
    # The growing step's cache slice grows: not replayable (the check can fail).
    assert not results["traces_equal"]["growing"]
    assert results["trace_len"] > 50


def _same_samples(a: list, b: list) -> bool:
    """Same tokens and finish reasons; logprobs equal up to fp32 rounding (the static
    step's softmax and sums run over more, exactly-zero, terms)."""
    for group_a, group_b in zip(a, b, strict=True):
        for (tok_a, lp_a, why_a), (tok_b, lp_b, why_b) in zip(group_a, group_b, strict=True):
            if tok_a != tok_b or why_a != why_b:
                return False
            if lp_a and (torch.tensor(lp_a) - torch.tensor(lp_b)).abs().max() > 1e-5:
                return False
    return True


def test_static_step_samples_like_the_growing_step(results):
    # Stop tokens end rows early, so compaction runs; same random stream, same samples.
    assert _same_samples(results["static"], results["growing"])
    assert any(reason == "stop" for g in results["static"] for _, _, reason in g)
    assert any(reason == "length" for g in results["static"] for _, _, reason in g)
    # Greedy does not depend on how often the host looks.
    greedy = results["greedy"]
    assert _same_samples(greedy[1], greedy[4]) and _same_samples(greedy[1], greedy[16])
    # Masked columns weigh exactly nothing, whatever fresh memory holds.
    assert results["static_nan_memory"] == results["static"]


def test_graph_path_captures_once_per_batch_and_replays_per_token(results):
    graph = results["graph"]
    assert graph["graphed"]
    assert graph["samples"] == results["static_half"]
    # One capture per decoded batch (compaction, at half the rows done, starts a new one).
    assert 1 <= graph["captures"] <= 4, graph
    assert graph["replays"] >= 20, graph
