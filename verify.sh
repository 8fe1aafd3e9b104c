#!/bin/sh
# HyperQwen checks (install, model, GPU, or a live server); all logic lives in hyperqwen.verify.
# Usage: verify.sh [--install | --server URL | --health] [--no-gpu] ...   (verify.sh --help)
exec python3 -m hyperqwen.verify "$@"
