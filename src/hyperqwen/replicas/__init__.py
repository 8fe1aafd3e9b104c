"""More than one card: one server per GPU (or per TP group) behind vLLM's own router (docs/multi-gpu.md).

gpus.py: the GPUS/TP checks (pure); compose.py: the compose override `hyperqwen replicas` writes;
router.py: `hyperqwen router` (vllm-router behind a key-checking, route-allowlisting gate);
cli.py: `hyperqwen replicas`.
"""
