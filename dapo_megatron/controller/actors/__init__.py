"""The Ray actors and their groups: the policy ranks, the generation engines, the refit
between them, their placement on the cluster, the remote-call timeouts, node loss and
preemption.

Nothing here knows of rollouts, the run context or the loop: this package imports no other
part of ``controller/`` (tests/unit/test_layers.py).
"""
