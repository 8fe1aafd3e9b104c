"""The GPU lab: the real stack (vLLM 0.32.0 CUDA, this project's patches, a full-size checkpoint) on a lent GPU
with no network, booted with the memory budget of a named card. Developer tooling, not part of the runtime
package; docs/gpu-lab.md says how to run a session. Tests: tests/unit/gpu_lab (run on CPU)."""
