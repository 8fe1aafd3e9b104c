"""HyperQwen: serve Qwen3.8-27B on one 24 GB GPU with vLLM."""

__version__ = "0.1.0"

# The vLLM release every patch, flag and memory formula here is written against.
VLLM_VERSION = "0.32.0"
