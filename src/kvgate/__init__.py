"""kvgate: does FP8 KV cache still work on every vLLM attention backend and GPU it claims?"""

__version__ = "0.1.0"
