"""Colocated phase changes return cached CUDA memory in a tested order (DESIGN section 8:
the caching allocator keeps freed blocks per process, which the CPU twin cannot show).

The controller's real GenerationGroup and SyncRollouts drive the real PolicyWorker and
GenerationWorker methods (Ray replaced by synchronous handles, the engine by a recording
backend); torch.cuda's calls are faked and recorded with the process that made them. The
policy must return its training peak before any engine maps weights or KV cache back,
and the engine's process its leftovers after it sleeps, before the policy trains.
"""

from __future__ import annotations

import gc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.actors import generation_group, policy_group, refitter
from dapo_megatron.controller.actors.generation_group import GenerationGroup
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.rollouts.rollout_source import SyncRollouts
from dapo_megatron.device import memory_release
from dapo_megatron.refit.buckets import plan_buckets
from dapo_megatron.shared.sampling import Sample
from dapo_megatron.workers.generation_worker import GenerationWorker
from dapo_megatron.workers.policy_worker import PolicyWorker
from unit.fake_context import fake_context

REPO = Path(__file__).resolve().parents[4]
N = 4  # samples per prompt

Event = tuple[str, str]  # (what, which process)


class Recorder:
    """The event log, and which stand-in process is running a call now."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.process = "controller"

    def record(self, what: str) -> None:
        self.events.append((what, self.process))


class Handle:
    """A Ray actor handle whose ``method.remote(...)`` runs at once and returns the result
    as its own reference (``gather`` is replaced by the identity)."""

    def __init__(self, target: Any, process: str, recorder: Recorder) -> None:
        self._target, self._process, self._recorder = target, process, recorder

    def __getattr__(self, method: str) -> SimpleNamespace:
        def remote(*args: Any, **kwargs: Any) -> Any:
            outer, self._recorder.process = self._recorder.process, self._process
            try:
                return getattr(self._target, method)(*args, **kwargs)
            finally:
                self._recorder.process = outer

        return SimpleNamespace(remote=remote)


class RecordingBackend:
    """A vLLM engine's memory protocol: the refit maps the weights back, ``wake`` the KV
    cache; generation answers mixed samples so dynamic sampling completes in one round."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    num_weight_ranks = 1

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[list[Sample]]:
        self.recorder.record("generate")
        return [[Sample([7, 2], [-0.5, -0.1], "stop") for _ in range(sampling.n)] for _ in prompts]

    def join_weight_group(self, address: Any, rank_offset: int, transport: Any) -> list[int]:
        return [rank_offset]

    def attach_shared(self, handles: list[bytes]) -> None:
        pass

    def receive_weights(self, layout: Any) -> list[dict[str, float]]:
        self.recorder.record("engine maps its weights, receives")
        return [{"bytes": 16.0}]

    def sleep(self) -> None:
        self.recorder.record("engine sleeps")

    def wake(self) -> None:
        self.recorder.record("engine maps its KV cache")

    def shutdown(self) -> None:
        pass


class FakePolicyWorker(PolicyWorker):
    """A policy rank without Megatron; ``release_memory`` is PolicyWorker's own."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.rank = recorder, 0

    def address(self) -> tuple[str, int]:
        return "127.0.0.1", 1

    def device_ids(self) -> str:
        return "0"

    def join_weight_group(self, address: Any, transport: str) -> None:
        pass

    def bucket_layout(self, bucket_bytes: int, dtype: str) -> list:
        return plan_buckets([("w", (4,))], torch.float32, bucket_bytes).to_wire()

    def share_buffer(self, layout_wire: list, exporters: int) -> bytes | None:
        return b"handle"

    def unlink_shared_buffer(self) -> None:
        pass

    def send_weights(self, layout_wire: list) -> dict[str, float]:
        self.recorder.record("policy sends")
        return {"seconds": 0.0}

    def train_step(self, batch: Any) -> dict[str, float]:
        self.recorder.record("train step")
        return {}


class FakeGenerationWorker(GenerationWorker):
    """GenerationWorker with the recording backend instead of vLLM."""

    recorder: Recorder

    def setup(self) -> dict[str, Any]:
        self.backend = RecordingBackend(self.recorder)  # type: ignore[assignment]
        return {"engine": self.engine_index}


class FakeVerifier:
    def score_batch(self, texts: list[str], truths: list[str]) -> SimpleNamespace:
        scores = [float(j % 2) for j in range(len(texts))]  # every group varies
        return SimpleNamespace(scores=scores, metrics={})


@pytest.fixture()
def colocated(monkeypatch: pytest.MonkeyPatch):
    recorder = Recorder()
    threads = torch.get_num_threads()
    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            "policy.model_name_or_path=/nonexistent/model",
            "cluster.device=cuda",
            "cluster.gpus_per_node=1",
            "generation.backend=vllm",
            f"dapo.num_generations_per_prompt={N}",
            "dapo.num_prompts_per_step=2",
            "dapo.dynamic_sampling.batch_multiplier=1",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=8",
        ],
    ).require_plan()
    assert plan.config.cluster.colocated and plan.refit_transport == "ipc"
    # torch.cuda as a recording stand-in, each call named with the process that made it.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # both hold CUDA memory
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 << 30)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: recorder.record("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: recorder.record("empty_cache"))
    monkeypatch.setattr(memory_release.gc, "collect", lambda *a: recorder.record("gc") or 0)
    # Ray: synchronous handles and the identity for gather.
    for module in (generation_group, policy_group, refitter):
        monkeypatch.setattr(module, "gather", lambda refs, describe: list(refs))

    def actor(cls: type) -> SimpleNamespace:
        def remote(*args: Any, **kwargs: Any) -> Handle:
            return Handle(cls(*args, **kwargs), "engine", recorder)

        return SimpleNamespace(options=lambda **_: SimpleNamespace(remote=remote))

    monkeypatch.setattr(generation_group, "ray", SimpleNamespace(remote=actor))
    place = SimpleNamespace(options={}, num_threads=1, visible_devices=None)
    monkeypatch.setattr(generation_group, "colocated_engine_placements", lambda *args: [place])
    monkeypatch.setattr(FakeGenerationWorker, "recorder", recorder, raising=False)
    monkeypatch.setattr(generation_group, "GenerationWorker", FakeGenerationWorker)

    policy = object.__new__(PolicyGroup)
    policy.plan, policy.config, policy.placement = plan, plan.config, None
    policy.workers = [Handle(FakePolicyWorker(recorder), "policy", recorder)]
    policy.layouts = [{"rank": 0}]
    engines = GenerationGroup(plan, policy)  # the real constructor, on the stand-ins
    ctx = fake_context(plan, 8, FakeVerifier())
    yield recorder, policy, engines, SyncRollouts(ctx, engines)
    gc.collect()
    torch.set_num_threads(threads)


def release(process: str) -> list[Event]:
    return [("sync", process), ("gc", process), ("empty_cache", process)]


def test_colocated_phase_changes_release_cached_memory_in_order(colocated) -> None:
    recorder, policy, engines, rollouts = colocated
    engines.refit(policy)  # loop._run_steps: the engines get the starting weights
    for step in range(2):
        rollouts.take(step)  # generate, then the engines sleep for the training phase
        policy.workers[0].train_step.remote(None)  # what the loop runs next
        engines.refit(policy)  # what the synchronous loop runs after training
    rollouts.take(2)
    refit = [
        *release("policy"),  # the training peak goes back before the weights are mapped
        ("policy sends", "policy"),
        ("engine maps its weights, receives", "engine"),
    ]
    generate_then_sleep = [
        ("generate", "engine"),
        ("engine sleeps", "engine"),
        *release("engine"),  # the engine's leftovers go back before the policy trains
    ]
    kv_wake = [*release("policy"), ("engine maps its KV cache", "engine")]
    step = [("train step", "policy"), *refit, *kv_wake, *generate_then_sleep]
    assert recorder.events == [*refit, *generate_then_sleep, *step, *step]


def test_split_engines_release_nothing_in_the_policy(colocated) -> None:
    recorder, policy, engines, _ = colocated
    engines._colocated_policy = None  # what the constructor sets in split mode
    engines.refit(policy)
    engines.sleep()
    engines.wake()
    assert [e for e in recorder.events if e[1] == "policy"] == [("policy sends", "policy")]
