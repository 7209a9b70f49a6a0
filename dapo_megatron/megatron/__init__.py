"""Everything that imports megatron.core lives in this package.

Parallel initialisation (distributed.py), the CPU compatibility layer (cpu_compat.py), the
GPT model built from an HF architecture (model.py) and HF <-> Megatron weight conversion
(hf_weights.py). Other packages (controller, algorithms, config) never import megatron.
"""
