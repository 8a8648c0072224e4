#!/usr/bin/env bash
# On the GPU machine: installs SGLang 0.5.17 from the files benchmarks/sglang/prepare.sh made (a folder: $1, default
# /tmp/keep/sg) into /tmp/sgsite, apart from vLLM's /tmp/vsite and llmopt's /tmp/site, and writes two launchers:
#   /tmp/bin/sglang-python  the image's python3 with /tmp/sgsite alone on PYTHONPATH. Name it in
#                           LLMOPT_SGLANG_PYTHON: llmopt then writes SGLang launch configs for 0.5.17 and checks
#                           their arguments with its parser (llmopt.deploy.validate_engine).
#   /tmp/sgbin/python3      the python3 that the deploy/sglang/launch.sh llmopt writes runs (`exec python3 -m
#                           sglang.launch_server ...`) and that `llmopt bench` asks whether it can import sglang.
#                           `python3 -m sglang...` runs as sglang-python; any other python3 command keeps its own
#                           PYTHONPATH, with a folder holding only the sglang package after it, so that llmopt's
#                           packages and the image's transformers stay first.
# Then, where llmopt runs: export PATH=/tmp/sgbin:$PATH LLMOPT_SGLANG_PYTHON=/tmp/bin/sglang-python
# The parts prepare.sh cut (.gpu/sg00 ...) travel one a device call, each within 30 s of the last one's end:
#   carry [".gpu/sg00"]: mkdir -p /tmp/keep/sgparts && cp .gpu/sg00/* /tmp/keep/sgparts/
#   ... and with the last: cat /tmp/keep/sgparts/sg.part.* | tar -x -C /tmp/keep && bash benchmarks/sglang/install.sh
# Without FA3 (prepare.sh without SG_FA3=1) `python3 -m sglang.launch_server` gets `--attention-backend
# ${SG_ATTENTION:-triton}` unless it names one: SGLang's default on Hopper, fa3, would fail to import.
# SGLang compiles some kernels on first use (activations, RMSNorm, Marlin W4A16, flashinfer's sampling) with nvcc
# and ninja: the launchers put the CUDA found here (CUDA_HOME, /usr/local/cuda, nvcc on PATH, the nvidia wheels) and
# the Python's bin folder (the image's ninja) on their PATH.
set -eu
K=${1:-/tmp/keep/sg}
S=/tmp/sgsite
py=$(python3 -c 'import sys; print(sys.executable)')  # the image's interpreter, even when python3 is /tmp/sgbin's
rm -rf "$S" /tmp/sgbin /tmp/bin/sglang-python
mkdir -p "$S" /tmp/sgbin/only /tmp/bin
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S" "$K"/*.whl
for f in sgl-kernel xgrammar fa3; do
  [ -e "$K/$f.tar.xz" ] || continue
  "$py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)' \
    < "$K/$f.tar.xz" | tar -x -C "$S"
done
ln -s "$S/sglang" /tmp/sgbin/only/sglang

cuda=${CUDA_HOME:-}  # a CUDA with bin/nvcc and include/cuda_runtime.h
if [ -z "$cuda" ]; then
  wheels=$("$py" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null || true)
  for c in /usr/local/cuda /usr/local/cuda-13* "$(dirname "$(dirname "$(command -v nvcc || echo /x/x)")")" "$wheels"; do
    [ -x "$c/bin/nvcc" ] && [ -e "$c/include/cuda_runtime.h" ] && { cuda=$c; break; }
  done
fi

cat > /tmp/bin/sglang-python <<W
#!/bin/sh
# python3 with SGLang 0.5.17 (/tmp/sgsite) alone on its path; \`-m sglang.launch_server\` without FA3 gets
# --attention-backend \${SG_ATTENTION:-triton} unless it names one (written by benchmarks/sglang/install.sh)
export PYTHONPATH=$S NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=\${HF_HUB_OFFLINE:-1} PATH=${cuda:+$cuda/bin:}$(dirname "$py"):\$PATH${cuda:+ CUDA_HOME=$cuda}
if [ "\${1:-} \${2:-}" = "-m sglang.launch_server" ] && [ ! -e $S/sgl_kernel/flash_ops.abi3.so ]; then
  named=
  for a in "\$@"; do case \$a in --attention-backend|--attention-backend=*) named=1 ;; esac; done
  if [ -z "\$named" ]; then
    echo "sglang-python: no FA3 here, so --attention-backend \${SG_ATTENTION:-triton}" >&2
    set -- "\$@" --attention-backend "\${SG_ATTENTION:-triton}"
  fi
fi
exec $py "\$@"
W
cat > /tmp/sgbin/python3 <<W
#!/bin/sh
# python3 for llmopt's SGLang launch configs: \`python3 -m sglang...\` runs as /tmp/bin/sglang-python; any other
# command with only the sglang package of /tmp/sgsite after its own path (written by benchmarks/sglang/install.sh)
case "\${1:-} \${2:-}" in "-m sglang"*) exec /tmp/bin/sglang-python "\$@" ;; esac
export PYTHONPATH=\${PYTHONPATH:+\$PYTHONPATH:}/tmp/sgbin/only
exec $py "\$@"
W
chmod +x /tmp/bin/sglang-python /tmp/sgbin/python3

echo "nvcc for SGLang's JIT kernels: ${cuda:-none found (set CUDA_HOME)}${cuda:+ ($("$cuda/bin/nvcc" --version | tail -1))}"
echo "host compiler: $(command -v c++ || command -v g++ || echo 'none found')"
echo "FA3: $([ -e "$S/sgl_kernel/flash_ops.abi3.so" ] && echo yes || echo "no (attention backend ${SG_ATTENTION:-triton})")"
/tmp/bin/sglang-python - <<'PY'
import importlib.metadata as m
import sglang.srt.server_args, sgl_kernel, flashinfer.sampling, xgrammar  # noqa: F401  what the server imports first
print(" ".join(f"{d} {m.version(d)}" for d in ("sglang", "sglang-kernel", "flashinfer-python", "xgrammar",
                                               "transformers", "torch", "triton")))
PY
