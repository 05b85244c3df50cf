#!/bin/bash
# The LLaMA-shaped CPU benchmark: accumd (bench_llama) and the same model and
# batch in PyTorch (bench_llama.py), one after the other in the same run.
# Usage: bash bench/bench_llama.sh [BUILD_DIR=build/release] [bench args...]
set -eu
build=${1:-build/release}
shift || true
here=$(cd "$(dirname "$0")" && pwd)
date -u +"%Y-%m-%d %H:%M UTC"
"$build/bench/bench_llama" "$@"
/usr/bin/python3 "$here/bench_llama.py" "$@"
