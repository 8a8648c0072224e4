#!/usr/bin/env bash
# Builds, in the project root, what SGLang 0.5.17 needs on the GPU machine beside the machine's image
# (benchmarks/sglang/deps.txt), for benchmarks/sglang/install.sh to install there:
#   .gpu/sg/         the wheels of deps.txt, except sglang-kernel and xgrammar, which go as trimmed package
#                    trees: sgl-kernel.tar.xz and xgrammar.tar.xz; with SG_FA3=1 also fa3.tar.xz (about 125 MiB)
#   .gpu/sg00 ...    .gpu/sg as one tar cut into parts of at most SG_PART_MIB (58) MiB: one part per device call
#                    (64 MiB a call), joined there by `cat sg.part.* | tar -x -C /tmp/keep` (install.sh's header)
# Trimmed from sglang-kernel 0.4.5 (365 MiB as a wheel, 1.2 GB unpacked):
#   - flash_ops.abi3.so, the FlashAttention-3 kernels (1.1 GB). sgl_kernel imports it only in
#     sgl_kernel.flash_attn, which SGLang imports when the fa3 attention backend starts. But on Hopper SGLang's
#     default backend for an MHA model such as Llama is fa3 whether or not FA3 is there
#     (ServerArgs._get_default_attn_backend), so without it the server needs another --attention-backend:
#     install.sh's python3 adds `--attention-backend triton` where none is given (flashinfer works too, and is
#     JIT-compiled on first use). SG_FA3=1 keeps FA3, in fa3.tar.xz, and SGLang's default then holds.
#   - sm100/ (the ops library loaded on every GPU but sm90), infllm_ops (MiniCPM's InfLLM attention, loaded on
#     first use) and flashmla_ops (DeepSeek's MLA, imported in try).
# Trimmed from xgrammar 0.2.1: lib/libxgrammar.a (a static library for C++ builds) and the debug sections of its
# Python binding (53 MB, 3 MB without them); its dist-info stays, since tvm_ffi finds the binding through RECORD.
# Needs pip (PYTHON, default python3), unzip, strip and xz here; /.gpu/ in .git/info/exclude.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
P="${PYTHON:-python3} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64"
XZ="xz -9 -T${SG_XZ_THREADS:-0}"
out=$repo/.gpu/sg
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out" "$repo"/.gpu/sg[0-9][0-9]
mkdir -p "$out" "$work/dl" "$work/kernel" "$work/fa3/sgl_kernel" "$work/xgrammar"
$P -d "$work/dl" -r "$here/deps.txt"

cd "$work/kernel"
if [ "${SG_FA3:-0}" = 1 ]; then
  unzip -q "$work"/dl/sglang_kernel-0.4.5-*.whl
  mv sgl_kernel/flash_ops.abi3.so "$work/fa3/sgl_kernel/"
  tar -cf - -C "$work/fa3" sgl_kernel | $XZ > "$out/fa3.tar.xz"
else
  unzip -q "$work"/dl/sglang_kernel-0.4.5-*.whl -x sgl_kernel/flash_ops.abi3.so
fi
rm -rf sgl_kernel/sm100 sgl_kernel/infllm_ops.* sgl_kernel/flashmla_ops.*
tar -cf - . | $XZ > "$out/sgl-kernel.tar.xz"

cd "$work/xgrammar"
unzip -q "$work"/dl/xgrammar-0.2.1-*.whl
rm -rf xgrammar/lib
strip --strip-debug xgrammar/libxgrammar_bindings.so
tar -cf - . | $XZ > "$out/xgrammar.tar.xz"

rm "$work"/dl/sglang_kernel-*.whl "$work"/dl/xgrammar-*.whl
mv "$work"/dl/*.whl "$out/"
tar -cf - -C "$repo/.gpu" sg | split -b "${SG_PART_MIB:-58}M" -d -a 2 - "$work/sg.part."
for f in "$work"/sg.part.*; do
  mkdir -p "$repo/.gpu/sg${f##*.}" && mv "$f" "$repo/.gpu/sg${f##*.}/"
done
cd "$repo"
ls -l .gpu/sg | sort -k5 -n | tail -6
du -sh .gpu/sg .gpu/sg[0-9][0-9]
echo "total: $(du -cb .gpu/sg[0-9][0-9]/* | tail -1 | cut -f1 | awk '{printf "%.1f MiB", $1 / 1048576}') in $(ls -d .gpu/sg[0-9][0-9] | wc -l) parts"
