"""Every knob's value as a typed attribute: `settings.knobs.max_len` instead of `settings["MAX_LEN"]`.

Generated from the knob table (config/knobs.py) by `hyperqwen knobs --write`; `hyperqwen knobs --check` and a
unit test fail when it is stale. Do not edit by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal


@dataclass(frozen=True)
class KnobValues:
    """The resolved value of each knob (config/settings.py Settings.knobs)."""

    mode: Literal["single", "batch"]
    models_dir: str
    model: str
    served_model_name: str
    dtype: Literal["auto", "bfloat16", "float16", "float32"]
    vision: bool
    bind: str
    port: int
    vllm_api_key: str
    api_key_file: str
    metrics_public: bool
    max_header_bytes: int
    max_body_bytes: int
    spec: Literal["mtp", "dflash2", "ngram", "mtp+lookup", "none"]
    draft_tokens: int
    dflash_tokens: int
    draft: str
    lookup_tokens: int
    ctx: Literal["fast", "long", "huge"]
    kv: Literal["bf16", "fp8", "int8", "int4"] | None
    max_len: int | None
    max_seqs: int | None
    max_batched_tokens: int | None
    gpu_util: float | None
    kv_mem: int | None
    prefix_cache: bool
    memory_check: Literal["strict", "warn", "off"]
    state_dtype: Literal["float16", "float32", "auto"]
    cuda_context: int
    cuda_graphs: int | None
    activation_peak: int | None
    uncounted_graphs: int | None
    profile_margin: int | None
    ram_cache: int | None
    embed_on_host: bool
    headroom_floor: int
    tools: bool
    tool_parser: Literal["qwen3_coder", "qwen3_xml", "hermes"]
    reasoning_parser: Literal["qwen3", "deepseek_r1", "none"]
    structured_output: Literal["xgrammar-compact", "guidance-compact", "xgrammar", "guidance", "auto"]
    thinking: bool
    client_thinking: bool
    stream_keepalive: int
    stream_progress: float
    temperature: float | None
    gdn_prefill: Literal["auto", "triton", "flashinfer"]
    extra_args: tuple[str, ...]
    monitor_port: int
    monitor_interval: float
    monitor_history: int
    webui_port: int
    webui_admin_email: str
    skip_verify: bool
    engine_stall_timeout: int
    hyperqwen_uid: int
    hyperqwen_gid: int
    hyperqwen_gpu: str
    hyperqwen_owner: str
    hyperqwen_tag: str
    gpus: str
    tp: int
    router_policy: Literal["cache_aware", "consistent_hash", "round_robin", "power_of_two"]
    scale_out: bool
    router_workers: str
    model_repo: str
    model_revision: str
    hf_token: str
    model_source_dir: str
    hf_hub_offline: bool
    quantize_embed: bool
    prepare_drafter: Literal["auto", "on", "off"]
    draft_vocab: int
    draft_vocab_ids: str

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> KnobValues:
        """From knob name -> value (a Settings); each attribute is its knob's name in lower case."""
        return cls(**{f.name: values[f.name.upper()] for f in fields(cls)})
