"""dapo_megatron.device.collectives: every collective on its group's device (DESIGN section 8).

(a) a static guard: no module outside ``device/collectives.py`` and ``refit/`` calls a
    ``torch.distributed`` collective itself (the CPU twin cannot see an NCCL group refuse a
    CPU tensor, so the rule is checked on the source);
(b) the device choice with the backend faked: NCCL groups get CUDA tensors (a fake CUDA
    tensor stands in on this CPU-only machine), gloo groups CPU ones, and results land in
    the caller's tensors;
(c) the wrappers on a real one-rank gloo group (two ranks:
    tests/distributed/test_collectives_gloo.py);
(d) the policy's hot-path modules create no tensor without an explicit device.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from dapo_megatron.device import collectives

PACKAGE = Path(__file__).resolve().parents[3] / "dapo_megatron"

# Everything in torch.distributed that sends data between ranks (the process-group-level
# functions, their deprecated and autograd variants).
COLLECTIVES = frozenset(
    {
        "all_gather",
        "all_gather_coalesced",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_single",
        "all_reduce",
        "all_reduce_coalesced",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "batch_isend_irecv",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "irecv",
        "isend",
        "monitored_barrier",
        "recv",
        "recv_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_single",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "send",
        "send_object_list",
        "_all_gather_base",
        "_reduce_scatter_base",
    }
)
EXEMPT = ("device/collectives.py", "refit/")


# ---------------------------------------------------------------------------------------
# (a) static guard


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted torch name, for every import of torch or its submodules."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:  # "import torch.distributed" binds "torch"
                        names[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module == "torch" or (node.module or "").startswith("torch."))
        ):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """``dist.nn.functional.all_gather`` -> ``torch.distributed.nn.functional.all_gather``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def direct_collectives(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every reference to a torch.distributed collective."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            if isinstance(node, ast.Name) and node.id not in aliases:
                continue
            name = _dotted(node, aliases)
            if (
                name is not None
                and name.startswith("torch.distributed.")
                and name.rsplit(".", 1)[-1] in COLLECTIVES
            ):
                found.append((node.lineno, name))
    return sorted(set(found))


def violations(root: Path) -> list[str]:
    """``file:line name`` for each direct collective under ``root`` (the package dir)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(EXEMPT):
            continue
        for line, name in direct_collectives(path.read_text()):
            out.append(f"{root.name}/{relative}:{line} {name}")
    return out


def test_no_direct_collectives_outside_the_module():
    found = violations(PACKAGE)
    assert not found, (
        "torch.distributed collectives called directly (route them through "
        "dapo_megatron.device.collectives, which puts tensors on the group's device):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed as dist\ndist.all_reduce(t)",
        "import torch\ntorch.distributed.broadcast(t, 0)",
        "import torch.distributed\ntorch.distributed.barrier()",
        "from torch.distributed import all_gather as ag\nag(xs, t)",
        "from torch import distributed\ndistributed.gather_object(o, None)",
        "import torch.distributed as dist\nf = dist.all_gather_into_tensor",
        "import torch.distributed as dist\ndist.nn.functional.all_gather(t)",
        "from torch.distributed import nn\nnn.functional.all_reduce(t)",
        "def f():\n    import torch.distributed as d\n    d.broadcast_object_list([1])",
    ],
)
def test_guard_sees_every_spelling(source):
    assert direct_collectives(source), source


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed as dist\ndist.get_world_size(); dist.ReduceOp.SUM",
        "from dapo_megatron.device import collectives\ncollectives.all_reduce(t)",
        "all_reduce(t)",  # not torch's
        "import torch.distributed as dist\nx = dist.is_initialized()",
    ],
)
def test_guard_passes_allowed_code(source):
    assert direct_collectives(source) == []


# ---------------------------------------------------------------------------------------
# (b) device choice with the backend faked


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that reports a CUDA device (this machine has no CUDA): its operations
    run on the wrapped CPU tensor, and their tensor results report the same device."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> FakeCudaTensor:
        fake = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=device
        )
        fake.elem = elem
        return fake

    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> FakeCudaTensor:  # type: ignore[override]
        # Tensor.copy_'s Python binding sets a CUDA device guard first, which a CPU-only
        # torch refuses; the dispatcher-level op reaches __torch_dispatch__ directly.
        torch.ops.aten.copy_.default(self, src, non_blocking)
        return self

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        device = None

        def unwrap(x: Any) -> Any:
            nonlocal device
            if isinstance(x, FakeCudaTensor):
                device = x.device
                return x.elem
            return x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

        def wrap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not isinstance(x, FakeCudaTensor):
                return FakeCudaTensor(x, device)
            return x

        return tree_map(wrap, out)


def _fake_move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """collectives._move for a machine without CUDA: CUDA copies are FakeCudaTensors, a
    copy back to the CPU unwraps."""
    if device.type == "cuda":
        source = tensor.elem if isinstance(tensor, FakeCudaTensor) else tensor
        return FakeCudaTensor(source.clone(), device)
    if isinstance(tensor, FakeCudaTensor):
        return tensor.elem.clone()
    return tensor.to(device)


@pytest.fixture
def fake_backend(monkeypatch):
    """Set the fake backend name; the torch.distributed functions underneath record the
    devices they receive (and act as a two-rank group would, so results differ from the
    inputs and a lost copy-back shows)."""
    seen: list[tuple[str, list[torch.device]]] = []
    backend = {"name": "nccl"}
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend["name"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(collectives, "_move", _fake_move)

    def all_reduce(tensor, op=None, group=None):
        seen.append(("all_reduce", [tensor.device]))
        tensor.mul_(2)  # two ranks holding the same values, summed

    def broadcast(tensor, src, group=None):
        seen.append(("broadcast", [tensor.device]))
        tensor.fill_(7)

    def all_gather(tensor_list, tensor, group=None):
        seen.append(("all_gather", [t.device for t in tensor_list] + [tensor.device]))
        for t in tensor_list:
            t.copy_(tensor + 1)

    def all_gather_into_tensor(output, tensor, group=None):
        seen.append(("all_gather_into_tensor", [output.device, tensor.device]))
        output.copy_(torch.cat([tensor, tensor]))

    for name, fn in [
        ("all_reduce", all_reduce),
        ("broadcast", broadcast),
        ("all_gather", all_gather),
        ("all_gather_into_tensor", all_gather_into_tensor),
        ("all_gather_single", all_gather_into_tensor),
    ]:
        monkeypatch.setattr(dist, name, fn, raising=False)
    return backend, seen


CUDA3 = torch.device("cuda", 3)
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "types", "device"),
    [
        ("nccl", ("cuda",), CUDA3),
        ("gloo", ("cpu",), CPU),
        ("cpu:gloo,cuda:nccl", ("cpu", "cuda"), CPU),
        ("cuda:nccl,cpu:gloo", ("cuda", "cpu"), CPU),
        ("cuda:nccl", ("cuda",), CUDA3),
        ("cuda:gloo", ("cpu",), CPU),  # we never hand gloo CUDA tensors
        ("ucc", ("cpu", "cuda"), CPU),
    ],
)
def test_device_for_reads_the_backend(fake_backend, name, types, device):
    backend, _ = fake_backend
    backend["name"] = name
    assert collectives.device_types() == types
    assert collectives.device_for() == device


def test_undefined_backend_follows_the_accelerator(fake_backend, monkeypatch):
    backend, _ = fake_backend
    backend["name"] = "undefined"
    monkeypatch.setattr(collectives, "_accelerator_type", lambda: "cuda")
    assert collectives.device_for() == CUDA3
    monkeypatch.setattr(collectives, "_accelerator_type", lambda: "cpu")
    assert collectives.device_for() == CPU


def test_bound_device_wins_over_current_device(fake_backend):
    class Group:
        bound_device_id = torch.device("cuda", 5)

    assert collectives.device_for(Group()) == torch.device("cuda", 5)


def test_nccl_all_reduce_moves_cpu_tensor_to_cuda_and_back(fake_backend):
    _, seen = fake_backend
    caller = torch.tensor([1.0, 2.0])
    returned = collectives.all_reduce(caller, collectives.SUM)
    assert seen == [("all_reduce", [CUDA3])]
    assert returned is caller and caller.device == CPU
    assert caller.tolist() == [2.0, 4.0]


def test_nccl_keeps_cuda_tensor_in_place(fake_backend, monkeypatch):
    _, seen = fake_backend
    on_gpu = FakeCudaTensor(torch.tensor([1.0, 2.0]), CUDA3)
    moves: list[torch.device] = []
    monkeypatch.setattr(collectives, "_move", lambda t, d: moves.append(d) or _fake_move(t, d))
    collectives.all_reduce(on_gpu)
    assert seen == [("all_reduce", [CUDA3])] and moves == []
    assert on_gpu.elem.tolist() == [2.0, 4.0]


def test_gloo_keeps_cpu_and_moves_cuda_to_cpu(fake_backend):
    backend, seen = fake_backend
    backend["name"] = "gloo"
    caller = torch.tensor([1.0, 2.0])
    collectives.all_reduce(caller)
    on_gpu = FakeCudaTensor(torch.tensor([3.0]), CUDA3)
    collectives.all_reduce(on_gpu)
    assert seen == [("all_reduce", [CPU]), ("all_reduce", [CPU])]
    assert caller.tolist() == [2.0, 4.0] and on_gpu.elem.tolist() == [6.0]


def test_nccl_tensor_collectives_copy_results_back(fake_backend):
    _, seen = fake_backend
    target = torch.zeros(3)
    collectives.broadcast(target, src=0)
    parts = [torch.zeros(2), torch.zeros(2)]
    collectives.all_gather(parts, torch.tensor([1.0, 2.0]))
    full = torch.zeros(4)
    collectives.all_gather_into_tensor(full, torch.tensor([5.0, 6.0]))
    assert [devices for _, devices in seen] == [[CUDA3], [CUDA3] * 3, [CUDA3] * 2]
    assert target.tolist() == [7.0] * 3
    assert [p.tolist() for p in parts] == [[2.0, 3.0], [2.0, 3.0]]
    assert full.tolist() == [5.0, 6.0, 5.0, 6.0]


def test_non_contiguous_tensor_is_reduced_in_place(fake_backend):
    backend, seen = fake_backend
    backend["name"] = "gloo"
    base = torch.arange(6.0).view(2, 3)
    view = base.t()  # non-contiguous: reduced in a contiguous copy, then copied back
    collectives.all_reduce(view)
    assert torch.equal(base, torch.arange(6.0).view(2, 3) * 2)


def test_reduce_values_is_one_collective(fake_backend):
    backend, seen = fake_backend
    values = {"a": 1.5, "b": torch.tensor(2.0), "c": torch.tensor([3.0], dtype=torch.float32)}
    out = collectives.reduce_values(values, collectives.SUM)
    assert seen == [("all_reduce", [CUDA3])]
    assert list(out) == ["a", "b", "c"]
    assert all(v.device == CUDA3 for v in out.values())  # left on the device
    assert {k: float(v.elem) for k, v in out.items()} == {"a": 3.0, "b": 4.0, "c": 6.0}
    backend["name"] = "gloo"
    seen.clear()
    out = collectives.reduce_values(values, collectives.MAX)
    assert seen == [("all_reduce", [CPU])] and out["a"].device == CPU
    assert collectives.reduce_values({}) == {}


# ---------------------------------------------------------------------------------------
# (c) real gloo groups


@pytest.fixture
def gloo_world():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_self_check_on_one_gloo_rank(gloo_world):
    result = collectives.self_check("cpu")
    assert result["backend"] == "gloo" and result["device_for"] == "cpu"
    assert all(
        v is True for k, v in result.items() if k not in ("backend", "device_for", "reduce_values")
    )


def test_self_check_refuses_the_wrong_device(gloo_world):
    with pytest.raises(AssertionError, match="device_for"):
        collectives.self_check("cuda")


# ---------------------------------------------------------------------------------------
# (d) no tensor without a device in the policy's hot path

HOT_PATH = ("megatron/policy_step.py", "megatron/packed_batches.py", "megatron/context_parallel.py")
FACTORIES = frozenset({"empty", "zeros", "ones", "full", "tensor"})


def _factories_without_device(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and node.func.attr in FACTORIES
            and not any(k.arg == "device" for k in node.keywords)
        ):
            lines.append(node.lineno)
    return lines


def test_hot_path_tensors_name_their_device():
    missing = {
        name: lines
        for name in HOT_PATH
        if (lines := _factories_without_device((PACKAGE / name).read_text()))
    }
    assert not missing, f"torch.empty/zeros/ones/full/tensor without device=: {missing}"
