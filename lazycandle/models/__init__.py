"""Models built on lazycandle's layers: GPT-2 and Llama with a KV cache and the samplers, BERT
encoders, Hugging Face folders (`from_pretrained`) and their tokenizers, llama GGUF files (`from_gguf`).

    python -m lazycandle.models.gpt2 --random-weights --config 124M --tokens 32
    python -m lazycandle.models.llama --random-weights --config tiny --tokens 32
"""
from .causal_lm import CausalLM, Generation, Session
from .generation import KVCache
from .gguf_llama import from_gguf
from .hub import PromptTooLong, from_pretrained
from .sampling import Sampler
from .tokenizer import Tokenizer

__all__ = ["CausalLM", "Generation", "KVCache", "PromptTooLong", "Sampler", "Session", "Tokenizer", "from_gguf",
           "from_pretrained"]
