"""Rollout generation behind one interface (``base.GenerationBackend``).

Backends live in their own modules so that importing this package imports neither
Megatron nor vLLM: the Megatron-Core engine (``dapo_megatron.megatron.inference``, CPU
default; everything that imports megatron.core lives under ``megatron/``) and the vLLM
backend (GPU default). The sample and sampling types are in ``dapo_megatron.shared.sampling``.
"""

from dapo_megatron.generation.base import GenerationBackend

__all__ = ["GenerationBackend"]
