"""The ground floor: types every layer shares (a sample and its sampling parameters, the
policy batch). Nothing here imports another module of the package, so the controller, the
generation engines, the Megatron code and the reward shaping can all import it without an
import running back up the layers.

Modules: ``sampling`` (``SamplingParams``, ``Sample``, ``FinishReason``; no torch),
``float_range`` (``FloatRange``, the interval of a float setting; no torch) and ``batch``
(``PolicyBatch``; imports torch). Nothing is re-exported here, so each name has one
import path and importing the sampling types does not import torch.
"""
