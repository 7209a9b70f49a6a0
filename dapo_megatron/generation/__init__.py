"""Rollout generation behind one interface (``base.GenerationBackend``).

Backends live in their own modules so that importing this package imports neither
Megatron nor vLLM: ``megatron_backend`` (Megatron-Core inference, CPU default) and the
vLLM backend (GPU default).
"""

from dapo_megatron.generation.base import FinishReason, GenerationBackend, Sample, SamplingParams

__all__ = ["FinishReason", "GenerationBackend", "Sample", "SamplingParams"]
