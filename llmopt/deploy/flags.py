"""Versioned flag tables of the serving engines: the option names and value types llmopt
writes, checked against each engine's own source of the version named here.

* vLLM 0.33.0 and 0.26.0: every long option of ``EngineArgs.add_cli_args`` (read from each
  wheel's parser; ``vllm serve`` adds host/port and other frontend options on the command
  line, which llmopt passes outside config.yaml);
* TensorRT-LLM 1.2.1: every ``TorchLlmArgs`` field (the keys of trtllm-serve's ``--config`` YAML) and the
  fields of the nested configs llmopt writes, from ``tensorrt_llm/llmapi/llm_args.py``; unknown keys are
  errors, as they are for TensorRT-LLM (its argument models forbid extra keys);
* SGLang 0.5.23: every option of ``ServerArgs.add_cli_args`` (read from the 0.5.23 wheel's parser,
  with the ``--no-x`` forms of its boolean options).

``check_flags`` validates a config against a table when the engine itself is not installed. The
``*_TABLES`` give each engine version llmopt has a table of; a serve backend writes for one of them or
for the engine installed here (``llmopt.deploy.versions``).
"""

from __future__ import annotations

from typing import Any


SGLANG_VERSION = "0.5.23"
SGLANG_FLAGS = frozenset("""
abort-on-priority-when-disabled admin-api-key allow-auto-truncate allowed-media-domains api-key
asr-max-buffer-seconds asr-max-concurrent-sessions attention-backend attention-context-parallel-size
attention-data-parallel-size attn-cp-size attn-dp-size base-gpu-id batch-notify-size bf16-gemm-backend
boundary-reduction bucket-e2e-request-latency bucket-inter-token-latency bucket-time-to-first-token
c128-page-size chat-template checkpoint-engine-wait-weights-before-ready chunked-prefill-size
completion-template config constrained-json-disable-any-whitespace constrained-json-max-whitespace-cnt
constrained-json-whitespace-pattern context-bucket context-length cp-strategy cpu-offload-gb crash-dump-folder
cuda-graph-backend-decode cuda-graph-backend-prefill cuda-graph-bs-decode cuda-graph-bs-prefill
cuda-graph-config cuda-graph-max-bs-decode cuda-graph-max-bs-prefill cuda-graph-max-seq-len-prefill
cuda-graph-prefill-max-context custom-weight-loader data-parallel-size dcp-comm-backend dcp-replicate-q-proj
dcp-size debug-cuda-graph debug-tensor-dump-input-file debug-tensor-dump-layers
debug-tensor-dump-output-folder decode-attention-backend decode-context-parallel-size decode-log-interval
decoupled-spec-bind-endpoint decoupled-spec-connect-endpoints decoupled-spec-rank decoupled-spec-role
decrypted-config-file decrypted-draft-config-file deepep-config deepep-dispatcher-output-dtype deepep-mode
deepep-v2-mode default-chat-template-kwargs default-priority-value delete-ckpt-after-loading
detokenizer-worker-num device disable-aiter-allreduce-fusion-in-decode
disable-aiter-allreduce-fusion-in-prefill disable-attn-tp-gather disable-chunked-prefix-cache
disable-cuda-graph disable-cuda-graph-padding disable-custom-all-reduce disable-decode-cuda-graph
disable-fast-image-processor disable-flashinfer-autotune disable-flashinfer-cutlass-moe-fp4-allgather
disable-hybrid-swa-memory disable-outlines-disk-cache disable-overlap-schedule disable-prefill-cuda-graph
disable-priority-preemption disable-radix-cache disable-shared-experts-fusion disable-tokenizer-batch-decode
disaggregation-bootstrap-port disaggregation-decode-allocation-policy
disaggregation-decode-enable-offload-kvcache disaggregation-decode-enable-radix-cache
disaggregation-decode-extra-slots disaggregation-decode-host-receive-threshold
disaggregation-decode-polling-interval disaggregation-decode-retraction-backup
disaggregation-enable-kv-checksum disaggregation-ib-device disaggregation-mode disaggregation-transfer-backend
dist-init-addr dist-timeout dllm-algorithm dllm-algorithm-config dllm-fdfo download-dir dp-size
dsa-decode-backend dsa-paged-mqa-logits-backend dsa-prefill-backend dsa-topk-backend dsa-triton-union
dsv4-attn-backend dsv4-prefill-backend dtype dwdp-size dynamic-batch-tokenizer-batch-size
dynamic-batch-tokenizer-batch-timeout elastic-ep-backend elastic-ep-initial-size elastic-ep-scale-timeout
enable-adaptive-dispatch-to-encoder enable-aiter-allreduce-fusion enable-amd-monokernel
enable-attn-tp-input-scattered enable-broadcast-mm-inputs-process enable-cache-report enable-cp-decode-attn-tp
enable-cudagraph-gc enable-custom-logit-processor enable-decoder-swa-bounded-replay
enable-deepseek-v4-fp4-indexer enable-dense-mlp-attn-tp enable-deterministic-inference enable-dp-attention
enable-dp-attention-local-control-broadcast enable-dp-lm-head enable-draft-weights-cpu-backup
enable-dsa-cache-layer-split enable-dsa-fused-indexer enable-dynamic-batch-tokenizer enable-dynamic-chunking
enable-elastic-expert-backup enable-encoder-swa-bounded-replay enable-eplb enable-flashinfer-allreduce-fusion
enable-flexkv enable-forward-pass-metrics enable-fp32-lm-head enable-fused-moe-sum-all-reduce
enable-fused-qk-norm-rope enable-hicache enable-hierarchical-cache enable-hisparse
enable-http-worker-reuseport enable-http2 enable-int8-mamba-checkpoint enable-kv-cache-sharding
enable-layernorm-sp enable-layerwise-nvtx-marker enable-lean-attention enable-linear-replayssm
enable-linear-replayssm-spec enable-linker-mla-dedup enable-lmcache enable-lora enable-lora-overlap-loading
enable-mamba-cache-stochastic-rounding enable-megamoe-for-layernorm-sp enable-memory-saver enable-metrics
enable-metrics-for-all-schedulers enable-mfu-metrics enable-mis enable-mixed-chunk enable-mm-global-cache
enable-mscclpp enable-multi-layer-eagle enable-multimodal enable-nccl-nvls enable-nvidia-megakernel
enable-p2p-check enable-page-major-kv-layout enable-paged-experts enable-pd-role-switch enable-pdmux
enable-precise-embedding-interpolation enable-prefill-cp enable-prefill-delayer enable-prefix-mm-cache
enable-priority-scheduling enable-profile-cuda-graph enable-quant-communications
enable-request-time-stats-logging enable-response-store enable-return-aux-hidden-states
enable-return-hidden-states enable-return-indexer-topk enable-return-routed-experts enable-scattered-sconv
enable-session-radix-cache enable-shared-experts-attn-tp enable-single-batch-overlap enable-ssl-refresh
enable-streaming-session enable-strict-thinking enable-symm-mem enable-tf32-matmul
enable-tokenizer-batch-encode enable-torch-compile enable-torch-compile-debug-mode enable-torch-symm-mem
enable-tp-lm-head-all-to-all enable-trace enable-two-batch-overlap enable-unified-cache-external-linker
enable-unified-memory enable-w4a4-mxfp4-megamoe enable-waterfill enable-watermark enable-weights-cpu-backup
encoder-bootstrap-port encoder-only encoder-register-urls encoder-transfer-backend encoder-urls
enforce-disable-flashinfer-allreduce-fusion enforce-shared-experts-fusion engine-info-bootstrap-port ep
ep-dispatch-algorithm ep-num-redundant-experts ep-size eplb-algorithm
eplb-min-rebalancing-utilization-threshold eplb-rebalance-layers-per-chunk eplb-rebalance-num-iterations
expert-balancedness-report-mode expert-distribution-recorder-buffer-size expert-distribution-recorder-mode
expert-parallel-size experts-shared-outer-loras export-metrics-to-file export-metrics-to-file-dir
extra-metric-labels fastapi-root-path file-storage-path flashinfer-a2a-dispatch-type
flashinfer-allreduce-fusion-backend flashinfer-autotune-skip-ops flashinfer-mla-disable-ragged
flashinfer-mxfp4-moe-precision flexkv-config-file forward-hooks forward-pass-metrics-ipc-name
forward-pass-metrics-worker-id fp4-gemm-backend fp8-gemm-backend fuseep-mode gated-launch-port
gc-threshold gc-warning-threshold-secs generation-tokens-buckets gpu-id-step grammar-backend
grpc-http-sidecar-port grpc-mode grpc-port grpc-response-timeout-secs hf-chat-template-name
hicache-host-memory-fraction hicache-host-memory-mode hicache-io-backend hicache-mem-layout hicache-ratio
hicache-size hicache-storage-backend hicache-storage-backend-extra-config hicache-storage-prefetch-policy
hicache-storage-prefetch-retry-max-attempts hicache-storage-prefetch-retry-poll-interval hicache-write-policy
hierarchical-sparse-attention-extra-config hisparse-config host http2-initial-connection-window-size
http2-max-concurrent-streams image-processor-backend incremental-streaming-output init-expert-location
int8-mamba-ckpt-size is-embedding json-model-override-args kt-cpuinfer kt-max-deferred-experts-per-token
kt-method kt-num-gpu-experts kt-threadpool-count kt-weight-path kv-cache-dtype kv-canary kv-canary-real-data
kv-canary-sweep-interval kv-events-config language-model-only language-only limit-mm-data-per-request
linear-attn-backend linear-attn-decode-backend linear-attn-prefill-backend linear-attn-verify-backend
linear-replayssm-cache-len lmcache-config-file load-balance-method load-format load-publish-endpoint
load-snapshot-publish-interval log-level log-level-http log-requests log-requests-format log-requests-level
log-requests-target lora-backend lora-drain-wait-threshold lora-eviction-policy lora-paths lora-strict-loading
lora-target-modules lora-use-virtual-experts mamba-backend mamba-cache-philox-rounds mamba-full-memory-ratio
mamba-max-states-per-path mamba-radix-cache-strategy mamba-ssm-dtype mamba-track-interval max-ep-size
max-loaded-loras max-lora-chunk-size max-lora-rank max-loras-per-batch max-mamba-cache-size max-prefill-tokens
max-queued-requests max-running-requests max-total-tokens media-url-max-file-size-mb mem-fraction-static
min-free-slots-delay mlx-enable-sampling mm-attention-backend mm-enable-dp-encoder mm-feature-transport
mm-global-cache-backend mm-io-worker-num mm-preprocess-cache-size-mb mm-process-config mm-processor-worker-num
model model-checksum model-config-parser model-impl model-loader-extra-config model-path modelexpress-config
modelopt-checkpoint-restore-path modelopt-checkpoint-save-path modelopt-export-path modelopt-quant
moe-a2a-backend moe-data-parallel-size moe-dense-tp-size moe-dp-size moe-runner-backend monokernel-backend
mooncake-ib-device msprobe-dump-config nccl-init-addr nccl-port nnodes node-rank num-continuous-decode-steps
num-reserved-decode-tokens numa-node offload-group-size offload-mode offload-num-in-group
offload-prefetch-step optimistic-prefill-attempts otlp-service-name otlp-traces-endpoint page-size
paged-experts-num-resident pdmux-config-path pipeline-parallel-size ple-offload-backend ple-offload-dir
ple-offload-embedding port pp-async-batch-depth pp-max-micro-batch-size pp-size pre-warm-nccl
preferred-sampling-params prefill-attention-backend prefill-decode-interval prefill-decode-interval-min-bs
prefill-delayer-forward-passes-buckets prefill-delayer-max-delay-ms prefill-delayer-max-delay-passes
prefill-delayer-queue-min-ratio prefill-delayer-token-usage-low-watermark prefill-delayer-wait-seconds-buckets
prefill-kv-cache-dequant-dtype prefill-max-requests prefill-only-disable-kv-cache
priority-scheduling-preemption-threshold prompt-tokens-buckets qsa-indexer-dtype quantization
quantization-param-path quantize-and-serve radix-cache-backend radix-eviction-policy
radix-eviction-policy-config random-seed reasoning-parser remote-instance-weight-loader-backend
remote-instance-weight-loader-seed-instance-ip remote-instance-weight-loader-seed-instance-service-port
remote-instance-weight-loader-send-weights-group-ports
remote-instance-weight-loader-start-seed-via-transfer-engine retraction-policy
return-aux-hidden-state-layer-ids return-hidden-states-mode return-input-ids return-output-ids revision
rl-on-policy-target rl-quant-profile sampling-backend sampling-defaults sampling-mask-max-tokens
schedule-conservativeness schedule-low-priority-values-first schedule-policy scheduler-recv-interval
served-model-name shared-experts-tp-size show-time-cost sidecar sidecar-args skip-server-warmup
skip-tokenizer-init sleep-on-idle sm-group-num smg-grpc-mode smg-http-sidecar-port soft-watchdog-timeout
spec-trace-dir speculative-accept-threshold-acc speculative-accept-threshold-single speculative-adaptive
speculative-adaptive-config speculative-algorithm speculative-attention-mode speculative-dflash-block-size
speculative-domino-candidate-pool-size speculative-draft-attention-backend speculative-draft-kv-cache-dtype
speculative-draft-load-format speculative-draft-model speculative-draft-model-path
speculative-draft-model-quantization speculative-draft-model-revision speculative-draft-sink-size
speculative-draft-window-size speculative-dsa-topk-backend
speculative-dspark-align-verify-tokens-to-graph-tier speculative-dspark-block-size
speculative-dspark-confidence-sts-path speculative-dspark-sps-table-path speculative-eagle-topk
speculative-enable-w4a4-mxfp4-megamoe speculative-moe-a2a-backend speculative-moe-runner-backend
speculative-ngram-capacity speculative-ngram-external-corpus-max-tokens speculative-ngram-external-corpus-path
speculative-ngram-external-sam-budget speculative-ngram-match-type speculative-ngram-max-bfs-breadth
speculative-ngram-max-trie-depth speculative-ngram-min-bfs-breadth speculative-num-draft-tokens
speculative-num-steps speculative-token-map speculative-use-block-verification
speculative-use-rejection-sampling ssl-ca-certs ssl-certfile ssl-keyfile ssl-keyfile-password
startup-weight-load-mode stream-interval stream-response-default-include-usage strip-thinking-cache
swa-full-tokens-ratio swa-prefix-tails tbo-token-distribution-threshold tensor-parallel-size tokenizer-backend
tokenizer-metrics-allowed-custom-labels tokenizer-metrics-custom-labels-header tokenizer-mode tokenizer-path
tokenizer-worker-num tool-call-parser tool-server torch-compile-max-bs tp-size trace-modules
triton-attention-num-kv-splits triton-attention-reduce-in-fp32 triton-attention-split-tile-size
trust-mm-content-hashes trust-remote-code trust-request-chat-template unified-cache-external-linker-backend
unified-cache-external-linker-config uno-lora-path use-ray uvicorn-access-log-exclude-prefixes warmups
watchdog-timeout watermark-config weight-cache-mode weight-cache-socket weight-cache-timeout
weight-loader-disable-mmap weight-loader-drop-cache-after-load weight-loader-prefetch-checkpoints
weight-loader-prefetch-num-threads weight-version
elastic-ep-join-mode elastic-ep-join-rank-offset no-dcp-replicate-q-proj no-dllm-fdfo
no-enable-decoder-swa-bounded-replay no-enable-dsa-fused-indexer no-enable-fused-qk-norm-rope
no-enable-tf32-matmul no-enable-tp-lm-head-all-to-all no-experts-shared-outer-loras no-lora-strict-loading
no-mm-enable-dp-encoder no-ple-offload-embedding no-speculative-enable-w4a4-mxfp4-megamoe
""".split())

SGLANG_QUANTIZATION = (
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt", "modelopt_fp8",
    "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "w4afp8",
    "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim", "mxfp_w4a8", "quark",
    "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming",
)
SGLANG_TYPES: dict[str, Any] = {
    "model-path": str, "served-model-name": str, "host": str, "port": int,
    "dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
    "quantization": SGLANG_QUANTIZATION,
    "kv-cache-dtype": ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"),
    "context-length": int, "mem-fraction-static": float, "max-running-requests": int, "max-total-tokens": int,
    "chunked-prefill-size": int, "max-prefill-tokens": int,
    "tp-size": int, "pp-size": int, "dp-size": int, "ep-size": int,
    "disable-radix-cache": bool, "trust-remote-code": bool, "enable-metrics": bool,
}
# other spellings of one option: the ``aliases`` of the field declarations in sglang/srt/arg_groups/fields/
# (SGLang 0.5.23); extras are written under the name the planner uses, so a planned value meets its alias
SGLANG_ALIASES = {
    "tensor-parallel-size": "tp-size", "pipeline-parallel-size": "pp-size", "data-parallel-size": "dp-size",
    "expert-parallel-size": "ep-size", "ep": "ep-size", "decode-context-parallel-size": "dcp-size",
    "attention-data-parallel-size": "attn-dp-size", "attention-context-parallel-size": "attn-cp-size",
    "moe-data-parallel-size": "moe-dp-size", "model": "model-path", "nccl-init-addr": "dist-init-addr",
    "enable-hicache": "enable-hierarchical-cache", "context-bucket": "cuda-graph-prefill-max-context",
    "speculative-draft-model": "speculative-draft-model-path", "grpc-http-sidecar-port": "smg-http-sidecar-port",
    "hierarchical-sparse-attention-extra-config": "hisparse-config",
}

TRTLLM_VERSION = "1.2.1"
# Every field of TorchLlmArgs (BaseLlmArgs and its PyTorch-backend fields): the keys trtllm-serve's --config
# YAML may hold. BaseLlmArgs and the nested configs below are pydantic StrictBaseModels (extra="forbid"), so
# an unknown key makes the server fail at start; llmopt refuses it at plan time. Read from
# tensorrt_llm/llmapi/llm_args.py of the TensorRT-LLM repository (main at commit 0004396, 2026): the 1.2.1
# wheel cannot be read here (its PyPI entry is a stub that downloads from NVIDIA's index). Fields added on
# main after 1.2.1 pass this table and fail at start; ``sampler_type``, removed on main, is a 1.2 field.
TRTLLM_FIELDS = frozenset("""
allreduce_strategy attention_dp_config attn_backend backend batch_wait_max_tokens_ratio batch_wait_timeout_iters
batch_wait_timeout_ms batched_logits_processor cache_transceiver_config checkpoint_format checkpoint_io_policy
checkpoint_loader context_parallel_size cp_config cuda_graph_config custom_tokenizer decoding_config
disable_mm_encoder disable_overlap_scheduler dtype dwdp_config enable_attention_dp enable_autotuner
enable_chunked_prefill enable_early_first_token_response enable_encoder_decoder_mixed_cuda_graph
enable_energy_metrics enable_in_graph_sampling enable_iter_perf_stats enable_iter_req_stats
enable_layerwise_nvtx_marker enable_lm_head_tp_in_adp enable_lora enable_low_latency_host_dispatch
enable_min_latency enable_mla_skip_correction enable_resource_governor enable_speculative_beam_history_d2h
encode_only encoder_cuda_graph_config encoder_max_batch_size encoder_max_num_tokens env_overrides
force_dynamic_quantization garbage_collection_gen0_threshold gather_generation_logits generation_config
gms_config gpus_per_node guided_decoding_backend iter_stats_max_iterations kv_cache_compression_config
kv_cache_config kv_connector_config layer_wise_benchmarks_config load_format lora_config max_batch_size
max_beam_width max_input_len max_num_tokens max_seq_len max_stats_len mla_skip_correction_threshold
mm_encoder_only model model_kwargs moe_cluster_parallel_size moe_config moe_expert_parallel_size
moe_tensor_parallel_size multimodal_config mx_config num_postprocess_workers num_serve_frontends
nvfp4_gemm_config orchestrator_type otlp_traces_endpoint peft_cache_config perf_metrics_max_requests
perf_metrics_output_dir pipeline_parallel_size post_processor_hook postprocess_tokenizer_dir pp_partition
prefill_capture_num_tokens prefill_cuda_graph_backend print_iter_log prometheus_metrics_config
ray_placement_config ray_worker_extension_cls ray_worker_nsight_options reasoning_parser reorder_policy_config
request_stats_max_iterations return_perf_metrics revision sampler_force_async_worker sampler_type
scheduler_config skip_tokenizer_init sleep_config sparse_attention_config speculative_config stream_interval
telemetry_config tensor_parallel_size tokenizer tokenizer_mode tokenizer_revision torch_compile_config
trust_remote_code use_cute_dsl_bf16_bmm use_cute_dsl_bf16_gemm use_cute_dsl_blockscaling_bmm
use_cute_dsl_blockscaling_mm use_fine_grained_sync
""".split())
# the fields of the nested configs (KvCacheConfig, CudaGraphConfig in its decode and encode modes, MoeConfig,
# SchedulerConfig, AttentionDpConfig, TorchCompileConfig) of the same llm_args.py
TRTLLM_NESTED_FIELDS: dict[str, frozenset] = {
    "kv_cache_config": frozenset("""
attention_dp_events_gather_period_ms avg_seq_len block_reuse_config copy_on_partial_reuse cross_kv_cache_fraction
disk_cache_path disk_cache_size disk_prefetch_num_reqs dtype enable_block_reuse enable_kv_pool_rebalance
enable_partial_reuse enable_swa_scratch_reuse event_buffer_max_size fp8_context_mla_kv_len_cap
free_gpu_memory_fraction host_cache_size iteration_stats_interval kv_cache_event_hash_algo kv_events_config
kv_pool_rebalance_check_interval kv_pool_rebalance_cooldown_secs kv_pool_rebalance_min_sampled_kv_caches
kv_pool_rebalance_moving_average_decay kv_pool_rebalance_ratio_threshold
kv_pool_rebalance_target_ratio_update_interval mamba_ssm_cache_dtype mamba_ssm_philox_rounds
mamba_ssm_stochastic_rounding mamba_state_cache_interval mamba_state_config max_attention_window
max_gpu_total_bytes max_tokens max_util_for_resume pool_ratio secondary_offload_min_priority sink_token_length
tokens_per_block use_kv_cache_manager_v2 use_uvm
""".split()),
    "cuda_graph_config": frozenset("batch_sizes enable_padding max_batch_size max_num_token max_seq_len mode "
                                   "num_tokens seq_lens".split()),
    "moe_config": frozenset("backend disable_finalize_fusion load_balancer max_num_tokens "
                            "use_low_precision_moe_combine".split()),
    "scheduler_config": frozenset("capacity_scheduler_policy context_chunking_policy dynamic_batch_config "
                                  "enable_prefix_aware_scheduling use_python_scheduler waiting_queue_policy".split()),
    "attention_dp_config": frozenset("""
batching_wait_iters enable_balance enable_kv_cache_aware_routing kv_cache_routing_account_for_in_transfer
kv_cache_routing_cold_start_warmup kv_cache_routing_conversation_affinity kv_cache_routing_fair_share_multiplier
kv_cache_routing_load_balance_weight kv_cache_routing_match_rate_threshold kv_cache_routing_max_sessions
kv_cache_routing_new_conv_placement timeout_iters
""".split()),
    "torch_compile_config": frozenset("capture_num_tokens enable_fullgraph enable_inductor enable_piecewise_cuda_graph "
                                      "enable_userbuffers max_num_streams".split()),
}
TRTLLM_TYPES: dict[str, Any] = {  # value types of the keys llmopt writes or users commonly set
    "dtype": ("auto", "float16", "bfloat16", "float32"),
    "max_batch_size": int, "max_num_tokens": int, "max_seq_len": int, "max_beam_width": int,
    "tensor_parallel_size": int, "pipeline_parallel_size": int, "context_parallel_size": int,
    "moe_expert_parallel_size": int, "moe_tensor_parallel_size": int, "gpus_per_node": int,
    "enable_attention_dp": bool, "disable_overlap_scheduler": bool, "enable_chunked_prefill": bool,
    "trust_remote_code": bool, "attn_backend": str,
    "print_iter_log": bool, "stream_interval": int, "num_postprocess_workers": int,
    "kv_cache_config": {"free_gpu_memory_fraction": float, "enable_block_reuse": bool, "dtype": str,
                        "max_tokens": int, "host_cache_size": int, "enable_partial_reuse": bool},
    "cuda_graph_config": {"enable_padding": bool, "max_batch_size": int, "batch_sizes": list},
    "moe_config": {"backend": str, "max_num_tokens": int},
    "scheduler_config": {}, "attention_dp_config": {}, "torch_compile_config": {},
    "speculative_config": dict, "sampler_type": str,
}

VLLM_VERSION = "0.33.0"  # what a config is written for when the recipe names no version and no vLLM is installed
VLLM_QUANTIZATION = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online",
    "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
)
VLLM_KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
    "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
    "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)
VLLM_TYPES: dict[str, Any] = {
    "served-model-name": str, "dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
    "quantization": VLLM_QUANTIZATION, "kv-cache-dtype": VLLM_KV_CACHE_DTYPES,
    "max-model-len": int, "max-num-seqs": int, "max-num-batched-tokens": int, "gpu-memory-utilization": float,
    "tensor-parallel-size": int, "pipeline-parallel-size": int, "data-parallel-size": int,
    "enable-expert-parallel": bool, "enable-chunked-prefill": bool, "enable-prefix-caching": bool,
    "enforce-eager": bool, "trust-remote-code": bool, "speculative-config": dict, "block-size": int, "seed": int,
}
# every long option of EngineArgs.add_cli_args in vLLM 0.33.0 (without the leading --)
VLLM_FLAGS = frozenset("""
additional-config aggregate-engine-logging all2all-backend allow-deprecated-quantization
allowed-local-media-path allowed-media-domains async-scheduling attention-backend attention-config
aux-output-config block-size code-revision collect-detailed-traces compilation-config config-format convert
cp-kv-cache-interleave-size cpu-distributed-timeout-seconds cpu-offload-gb cpu-offload-params
cudagraph-capture-sizes cudagraph-metrics custom-histogram-buckets data-parallel-address data-parallel-backend
data-parallel-external-lb data-parallel-hybrid-lb data-parallel-multi-port-external-lb data-parallel-rank
data-parallel-rpc-port data-parallel-size data-parallel-size-local data-parallel-start-rank
dbo-decode-token-threshold dbo-prefill-token-threshold dcp-comm-backend dcp-kv-cache-interleave-size
dcp-q-replicate decode-context-parallel-size default-mm-loras device-ids device-memory-utilization
diffusion-config disable-batch-sharded-sampling disable-cascade-attn disable-chunked-mm-input
disable-chunked-prefill disable-cumem-allocator disable-custom-all-reduce disable-dbo disable-elastic-ep
disable-ep-weight-filter disable-eplb disable-expert-parallel disable-fault-tolerance
disable-flashinfer-autotune disable-hc-sp disable-hybrid-kv-cache-manager disable-layerwise-nvtx-tracing
disable-log-stats disable-logging-iteration-details disable-lora disable-mamba-cache-stochastic-rounding
disable-mamba-shared-prefix-checkpoint disable-mfu-metrics disable-mixed-moe-lora-format disable-mm-embeds
disable-moe-shared-loras disable-nccl-comm-suspend disable-nccl-for-dp-synchronization disable-prefix-caching
disable-prompt-embeds disable-return-routed-experts disable-shm-tensor-arena disable-sleep-mode
disable-sliding-window disable-tower-connector-lora disable-trace-replay distributed-executor-backend
distributed-timeout-seconds download-dir dp-sync-interval dtype ec-manager-config ec-transfer-config
elastic-ep-max-dp-size enable-batch-sharded-sampling enable-cascade-attn enable-chunked-mm-input
enable-chunked-prefill enable-cumem-allocator enable-custom-all-reduce enable-dbo enable-elastic-ep
enable-ep-weight-filter enable-eplb enable-expert-parallel enable-fault-tolerance enable-flashinfer-autotune
enable-hc-sp enable-hybrid-kv-cache-manager enable-layerwise-nvtx-tracing enable-logging-iteration-details
enable-lora enable-mamba-cache-stochastic-rounding enable-mamba-shared-prefix-checkpoint enable-mfu-metrics
enable-mixed-moe-lora-format enable-mm-embeds enable-moe-shared-loras enable-nccl-comm-suspend
enable-nccl-for-dp-synchronization enable-prefix-caching enable-prompt-embeds enable-return-routed-experts
enable-shm-tensor-arena enable-sleep-mode enable-sliding-window enable-tower-connector-lora
enable-trace-replay enforce-eager engram-config eplb-config expert-placement-strategy
fail-on-environ-validation fault-tolerance-config fully-sharded-loras gdn-prefill-backend generation-config
gpu-memory-utilization help hf-config-path hf-overrides hf-token ignore-patterns interleave-mm-strings
io-processor-plugin ir-op-priority jit-monitor-mode jit-monitor-verbose kda-decode-backend kda-prefill-backend
kernel-config kv-cache-dtype kv-cache-dtype-skip-layers kv-cache-memory-bytes kv-cache-metrics
kv-cache-metrics-sample kv-events-config kv-offloading-backend kv-offloading-size kv-sharing-fast-prefill
kv-transfer-config language-model-only limit-mm-per-prompt linear-backend load-format log-config-file
log-level logging-config logits-processors logprobs-mode long-prefill-token-threshold
long-prefill-token-threshold-adaptive lora-dtype lora-target-modules mamba-backend mamba-block-size
mamba-cache-dtype mamba-cache-mode mamba-cache-philox-rounds mamba-ssm-cache-dtype mamba-ssu-algorithm
master-addr master-port max-cpu-loras max-cudagraph-capture-size max-logprobs max-lora-cls-labels
max-lora-rank max-loras max-model-len max-num-active-seqs max-num-batched-tokens max-num-queued-reqs
max-num-queued-tokens max-num-scheduled-tokens max-num-seqs max-parallel-loading-workers media-io-kwargs
mm-device-do-normalize mm-encoder-attn-backend mm-encoder-attn-dtype mm-encoder-fp8-scale-path
mm-encoder-fp8-scale-save-margin mm-encoder-fp8-scale-save-path mm-encoder-only mm-encoder-tp-mode
mm-hasher-algorithm mm-ipc-gpu-memory-gb mm-processor-cache-gb mm-processor-cache-type mm-processor-device
mm-processor-kwargs mm-shm-cache-max-object-size-mb mm-tensor-ipc model model-class-overrides model-impl
model-loader-extra-config moe-backend monokernel nnodes no-allow-deprecated-quantization no-async-scheduling
no-cudagraph-metrics no-data-parallel-external-lb no-data-parallel-hybrid-lb no-dcp-q-replicate
no-enforce-eager no-fail-on-environ-validation no-fully-sharded-loras no-interleave-mm-strings
no-jit-monitor-verbose no-kv-cache-metrics no-kv-sharing-fast-prefill no-language-model-only
no-long-prefill-token-threshold-adaptive no-mm-device-do-normalize no-mm-encoder-only no-monokernel
no-numa-bind no-ray-workers-use-nsight no-return-sampling-mask no-scheduler-reserve-full-isl
no-skip-mm-profiling no-skip-tokenizer-init no-sleep-mode-offload-cudagraph no-specialize-active-lora
no-swa-bounded-replay no-trust-remote-code no-use-fp64-gumbel no-use-replayssm no-use-tqdm-on-load node-rank
num-gpu-blocks-override numa-bind numa-bind-cpus numa-bind-nodes offload-backend offload-group-size
offload-num-in-group offload-params offload-prefetch-step optimization-level otlp-traces-endpoint
override-generation-config per-request-spec-decode-metrics performance-mode pipeline-parallel-size
pooler-config prefill-context-parallel-size prefill-schedule-interval prefix-cache-retention-interval
prefix-caching-hash-algo prefix-match-unit profiler-config pt-load-map-location quantization
quantization-config ray-workers-use-nsight reasoning-config reasoning-parser reasoning-parser-plugin
renderer-num-workers replayssm-buffer-len return-sampling-mask revision runner safetensors-load-strategy
safetensors-prefetch-block-size safetensors-prefetch-num-threads scheduler-cls scheduler-reserve-full-isl
scheduling-policy seed served-model-name show-hidden-metrics-for-version shutdown-timeout skip-mm-profiling
skip-tokenizer-init sleep-mode-backend sleep-mode-offload-cudagraph sleep-preserve-parameter-names
sparse-indexer-topk-backend spec-method spec-model spec-tokens specialize-active-lora speculative-config
stream-interval structured-outputs-config swa-bounded-replay tensor-parallel-size tokenizer tokenizer-mode
tokenizer-revision trust-remote-code ubatch-size use-fp64-gumbel use-replayssm use-tqdm-on-load
video-pruning-method video-pruning-rate watchdog-config watermark watermark-config weight-transfer-config
worker-cls worker-extension-cls
""".split())

# vLLM 0.26.0 (what benchmarks/gpu_vllm.sh runs on the GPU; docs/results/gpu-engines.md): every long option of its
# EngineArgs.add_cli_args(FlexibleArgumentParser()), read from the vllm-0.26.0 wheel's own parser, kept here as
# its difference from 0.33.0's list. Each flag llmopt itself writes is an EngineArgs field in both releases
# (vllm/engine/arg_utils.py, line in 0.26.0 / 0.33.0): served-model-name 423/498, trust-remote-code 431/506,
# dtype 442/517, kv-cache-dtype 443/518, max-model-len 445/520, distributed-executor-backend 456/531,
# pipeline-parallel-size 460/535, tensor-parallel-size 473/548, prefill-context-parallel-size 474/549,
# data-parallel-size 479/555, enable-expert-parallel 489/566, enable-prefix-caching 513/598,
# gpu-memory-utilization 526/614, max-num-batched-tokens 528/616, max-num-seqs 533/622, quantization 547/640,
# enforce-eager 555/648, enable-chunked-prefill 612/713, speculative-config 630/732.
VLLM_ADDED_AFTER_0_26 = frozenset("""
aux-output-config custom-histogram-buckets dcp-q-replicate device-memory-utilization
disable-batch-sharded-sampling disable-chunked-prefill disable-cumem-allocator disable-dbo disable-elastic-ep
disable-ep-weight-filter disable-eplb disable-expert-parallel disable-fault-tolerance
disable-flashinfer-autotune disable-hc-sp disable-layerwise-nvtx-tracing disable-logging-iteration-details
disable-lora disable-mamba-cache-stochastic-rounding disable-mamba-shared-prefix-checkpoint disable-mfu-metrics
disable-mixed-moe-lora-format disable-mm-embeds disable-moe-shared-loras disable-nccl-comm-suspend
disable-prefix-caching disable-prompt-embeds disable-return-routed-experts disable-shm-tensor-arena
disable-sleep-mode disable-tower-connector-lora disable-trace-replay dp-sync-interval ec-manager-config
elastic-ep-max-dp-size enable-batch-sharded-sampling enable-cascade-attn enable-chunked-mm-input
enable-custom-all-reduce enable-fault-tolerance enable-hc-sp enable-hybrid-kv-cache-manager
enable-mamba-shared-prefix-checkpoint enable-nccl-comm-suspend enable-nccl-for-dp-synchronization
enable-shm-tensor-arena enable-sliding-window enable-trace-replay engram-config fault-tolerance-config
kda-decode-backend kda-prefill-backend log-config-file log-level logging-config
long-prefill-token-threshold-adaptive mamba-ssu-algorithm max-lora-cls-labels max-num-active-seqs
max-num-queued-reqs max-num-queued-tokens mm-device-do-normalize mm-hasher-algorithm mm-processor-device
monokernel no-dcp-q-replicate no-long-prefill-token-threshold-adaptive no-mm-device-do-normalize no-monokernel
no-return-sampling-mask no-sleep-mode-offload-cudagraph no-swa-bounded-replay no-use-replayssm
per-request-spec-decode-metrics prefix-cache-retention-interval replayssm-buffer-len return-sampling-mask
sleep-mode-backend sleep-mode-offload-cudagraph sleep-preserve-parameter-names sparse-indexer-topk-backend
swa-bounded-replay use-replayssm video-pruning-method watchdog-config watermark-config
""".split())
VLLM_REMOVED_AFTER_0_26 = frozenset("""
calculate-kv-scales enable-bf16x3-router-gemm max-long-partial-prefills max-num-partial-prefills
no-calculate-kv-scales no-disable-cascade-attn no-disable-chunked-mm-input no-disable-custom-all-reduce
no-disable-hybrid-kv-cache-manager no-disable-nccl-for-dp-synchronization no-disable-sliding-window
no-enable-bf16x3-router-gemm no-enable-chunked-prefill no-enable-cumem-allocator no-enable-dbo
no-enable-elastic-ep no-enable-ep-weight-filter no-enable-eplb no-enable-expert-parallel
no-enable-flashinfer-autotune no-enable-layerwise-nvtx-tracing no-enable-logging-iteration-details
no-enable-lora no-enable-mamba-cache-stochastic-rounding no-enable-mfu-metrics no-enable-mixed-moe-lora-format
no-enable-mm-embeds no-enable-moe-shared-loras no-enable-prefix-caching no-enable-prompt-embeds
no-enable-return-routed-experts no-enable-sleep-mode no-enable-tower-connector-lora override-attention-dtype
""".split())
VLLM_TABLES: dict[str, frozenset] = {
    "0.33.0": VLLM_FLAGS, "0.26.0": (VLLM_FLAGS - VLLM_ADDED_AFTER_0_26) | VLLM_REMOVED_AFTER_0_26}
# Releases whose config-file loader drops a boolean set to false (vLLM 0.26.0's FlexibleArgumentParser.
# load_config_file, vllm/utils/argparse_utils.py line 572: only `true` becomes an argument), so a planned
# `enable-chunked-prefill: false` is written as `no-enable-chunked-prefill: true`; 0.33.0's loader passes
# `--no-x` for `x: false` (line 657).
VLLM_DROPS_FALSE = frozenset({"0.26.0"})
SGLANG_TABLES: dict[str, frozenset] = {SGLANG_VERSION: SGLANG_FLAGS}
TRTLLM_TABLES: dict[str, frozenset] = {TRTLLM_VERSION: TRTLLM_FIELDS}
