"""controller/actors/preemption.py's exit path after SIGTERM: the GCS probe and the final line
printed once (by the CLI or the exit watchdog, whichever comes first)."""

from __future__ import annotations

import socket
from pathlib import Path

from dapo_megatron.controller.actors.preemption import Preemption, gcs_reachable, saved_words


def test_gcs_probe_sees_a_listening_port_and_a_closed_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert gcs_reachable(address)
    assert not gcs_reachable(address)  # closed now: refused at once
    assert not gcs_reachable("not an address")


def test_the_final_line_is_printed_once():
    hook = Preemption(30, final_line=lambda outcome: f"preempted: SIGTERM; {outcome}hint")
    hook.outcome = saved_words(7, None)
    assert hook.outcome == ""
    hook.outcome = saved_words(7, Path("/x/step_000007"))
    assert hook.final_line() == "preempted: SIGTERM; saved step 7; hint"
    assert hook.final_line() is None
