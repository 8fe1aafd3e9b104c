"""Regenerate the captured /metrics fixtures in data/ from a real vLLM CPU server (not a test).

    HYPERQWEN_TEST_MODELS=... python tests/unit/monitor/capture_metrics.py {smollm2|tiny-qwen-mtp}

Starts one server through `hyperqwen serve` (the integration fixtures' knobs), scrapes /metrics idle, then
sends requests one at a time with a scrape after each, and writes data/<name>/NN.prom plus manifest.json
(scrape times and what the client saw for each request: prompt/completion tokens, finish reason, TTFT).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "integration"))

import requests  # noqa: E402

import conftest as fixtures  # noqa: E402  (the integration server helpers)

PROMPTS = [
    ("Name three colours.", 24),
    ("What is the capital of France?", 40),
    ("Count from one to twenty in words.", 8),  # cut short: finish_reason length
    ("Say hello.", 48),
]


def scrape(server) -> str:
    response = requests.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {server.api_key}"},
                            timeout=30)
    response.raise_for_status()
    return response.text


def main(which: str) -> int:
    from support import testmodels

    models = testmodels.ensure_test_models()
    knobs = {"smollm2": fixtures.SMOL_KNOBS, "tiny-qwen-mtp": fixtures.TINY_QWEN_MTP_KNOBS}[which]
    model = models["smollm2" if which == "smollm2" else "tiny-qwen"]
    out = HERE / "data" / which
    out.mkdir(parents=True, exist_ok=True)
    log_dir = Path("/tmp") / f"monitor-capture-{which}"
    log_dir.mkdir(exist_ok=True)
    server = fixtures.start_server(which, model, knobs, log_dir)
    manifest = {"model": which, "knobs": server.knobs, "scrapes": [], "requests": []}
    try:
        client = server.openai()
        index = 0

        def save(note: str) -> None:
            nonlocal index
            text = scrape(server)
            name = f"{index:02d}.prom"
            # The capture's random API key never appears in /metrics; the port does not matter.
            (out / name).write_text(text)
            manifest["scrapes"].append({"file": name, "time": time.time(), "note": note})
            index += 1

        save("idle after start")
        for prompt, max_tokens in PROMPTS:
            started = time.monotonic()
            ttft = None
            usage = None
            finish = None
            stream = client.chat.completions.create(
                model=server.served_model_name, messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True})
            for chunk in stream:
                if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                    ttft = time.monotonic() - started
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if chunk.usage:
                    usage = chunk.usage
            manifest["requests"].append({
                "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                "finish_reason": finish, "client_ttft_s": ttft, "client_duration_s": time.monotonic() - started})
            time.sleep(1.5)  # vLLM's engine stats reach /metrics on the next logging step
            save(f"after request {len(manifest['requests'])}")
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    finally:
        fixtures.stop_server(server)
    print(f"wrote {index} scrapes to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
