"""Models built on lazycandle's layers: GPT-2 and Llama with a KV cache and the samplers, BERT
encoders, Hugging Face folders (`from_pretrained`) and their tokenizers.

    python -m lazycandle.models.gpt2 --random-weights --config 124M --tokens 32
    python -m lazycandle.models.llama --random-weights --config tiny --tokens 32
"""
from .causal_lm import CausalLM, Generation, Session
from .generation import KVCache
from .hub import PromptTooLong, from_pretrained
from .sampling import Sampler
from .tokenizer import Tokenizer

__all__ = ["CausalLM", "Generation", "KVCache", "PromptTooLong", "Sampler", "Session", "Tokenizer", "from_pretrained"]
