"""The GPU first-contact check (``python -m dapo_megatron.gpu_check``; see ``__main__``)."""
