"""Rollout production: what is generated, when, and how it becomes a batch.

The round planner and the overlapped stream (with its schedule), dynamic sampling's
rounds, the skip rule's draws, the tail cut and its partial groups, the response cap,
scoring and batching, and a step's named phases (``steps``). It drives the actors
(``controller/actors/``), which never import it (tests/unit/test_layers.py).
"""
