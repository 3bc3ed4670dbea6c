"""Text generators built on lazycandle ops: GPT-2 and Llama with a KV cache, and the samplers.

    python -m lazycandle.models.gpt2 --random-weights --config 124M --tokens 32
    python -m lazycandle.models.llama --random-weights --config tiny --tokens 32
"""
from .generation import Generation, KVCache, generate
from .sampling import Sampler

__all__ = ["Generation", "KVCache", "Sampler", "generate"]
