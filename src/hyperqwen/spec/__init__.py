"""Speculative decoding: pure checks and facts about drafters (no vLLM import)."""
