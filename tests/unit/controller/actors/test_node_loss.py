"""Node loss: the restart decides from the node's state (controller/actors/node_loss.py).

The controller sees a lost node's workers die before the GCS marks the node dead (Ray's
health check: 5 failed checks 3 s apart by default), so ``settle_nodes`` waits until every
node of the failed attempt is either marked dead or has a raylet that answers, at most the
health check's window. Pure: the node table and the raylet probe are stand-ins, except the
probe's own test, which dials real sockets.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from dapo_megatron.controller.actors import node_loss


def _node(node_id: str, port: int = 1) -> dict[str, Any]:
    return {
        "NodeID": node_id,
        "Alive": True,
        "NodeManagerAddress": "127.0.0.1",
        "NodeManagerPort": port,
        "Resources": {"CPU": 1.0},
    }


def test_ray_health_check_defaults_and_window():
    # Ray 2.60 (src/ray/common/ray_config_def.h), as ray._raylet.Config reports them.
    settings = node_loss.health_check()
    assert settings == {
        "health_check_period_ms": 3000,
        "health_check_timeout_ms": 10000,
        "health_check_failure_threshold": 5,
    }
    # 5 checks of up to 10 s deadline + 3 s period, one period before the first, slack.
    assert node_loss.health_check_window_s(settings) == 5 * (3 + 10) + 3 + node_loss.SLACK_S


def _table(monkeypatch: pytest.MonkeyPatch, rounds: list[dict[str, dict[str, Any]]]) -> list[int]:
    """alive_nodes answers ``rounds`` in turn (the last one from then on); the calls made."""
    calls = [0]

    def alive() -> dict[str, dict[str, Any]]:
        calls[0] += 1
        return rounds[min(calls[0], len(rounds)) - 1]

    monkeypatch.setattr(node_loss, "alive_nodes", alive)
    return calls


def test_a_worker_death_on_a_live_node_waits_for_nothing(monkeypatch):
    before = {"a": _node("a"), "b": _node("b")}
    calls = _table(monkeypatch, [before])
    monkeypatch.setattr(node_loss, "raylet_answers", lambda node: True)
    assert node_loss.settle_nodes(before, window_s=60, poll_s=0.01) < 1
    assert calls[0] == 1


def test_a_dead_raylet_is_waited_for_until_the_gcs_marks_its_node_dead(monkeypatch):
    before = {"a": _node("a"), "b": _node("b")}
    # The GCS still says alive for 3 looks (its health check not yet failed 5 times).
    calls = _table(monkeypatch, [before, before, before, {"a": before["a"]}])
    monkeypatch.setattr(node_loss, "raylet_answers", lambda node: node["NodeID"] == "a")
    waited = node_loss.settle_nodes(before, window_s=60, poll_s=0.01)
    assert calls[0] == 4 and waited < 5
    assert [n["NodeID"] for n in node_loss.lost_nodes(before)] == ["b"]


def test_the_wait_ends_with_the_health_check_window(monkeypatch):
    before = {"a": _node("a")}
    _table(monkeypatch, [before])  # the GCS never marks it dead: its word stands
    monkeypatch.setattr(node_loss, "raylet_answers", lambda node: False)
    waited = node_loss.settle_nodes(before, window_s=0.2, poll_s=0.01)
    assert 0.2 <= waited < 2
    assert node_loss.lost_nodes(before) == []


def test_raylet_answers_dials_the_node_manager_port():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert node_loss.raylet_answers(_node("a", port))
    assert not node_loss.raylet_answers(_node("a", port))  # closed: refused at once
    assert not node_loss.raylet_answers({"NodeID": "a"})  # no address known
