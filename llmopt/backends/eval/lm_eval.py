"""Eval: a task of EleutherAI's lm-evaluation-harness, through its own Python API.

``task`` is a registered task name (``arc_easy``; its data comes from the hub) or
a local task YAML file (relative to the recipe). With ``data``, the task reads
that local file (.jsonl, .json, .csv or .parquet) as its test split instead of
its own dataset, so a registered task or a YAML runs offline; relative
``data_files`` inside a YAML are read relative to the YAML. A YAML's
``!function`` tags import Python files next to it: use YAMLs you trust.

The model is lm-eval's ``HFLM`` over the stage's model folder, or, with
``runtime = "endpoint"``, lm-eval's ``local-completions`` client of that
OpenAI-compatible server (tokenized with the model folder's tokenizer).
``lm_eval.simple_evaluate`` runs with ``log_samples=True``; each logged sample
becomes a row ``{id: "<task>/<doc_id>", score: <metric>}`` of ``scores.jsonl``,
so the gate pairs baseline and candidate document by document. For a group of
tasks the value is the mean over all their documents.

The cache key covers the options and the ``data`` file's content, not the
YAML's content: after editing a YAML, run again with ``--force eval``.
Needs: lm-eval (``pip install 'llmopt[eval]'``), torch and transformers.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from llmopt import data as datasets
from llmopt.scoring import evalkit
from llmopt.backends.base import EvalBackend, Options, PlanContext, StageContext
from llmopt.libraries import package_version, require
from llmopt.errors import Problem, StageFailed
from llmopt.registry import register

DATA_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


class LmEvalOptions(Options):
    task: str = Field(description="A registered lm-eval task name (arc_easy, hellaswag, ...) or a local task YAML file.")
    data: str | None = Field(None, description="Local data file (.jsonl/.json/.csv/.parquet) the task reads as its test split (offline).")
    metric: str = Field("acc", description="Per-example metric the gate uses: acc, acc_norm, exact_match, ... (one the task reports).")
    filter: str | None = Field(None, description="lm-eval filter whose results are scored (default: the task's first, usually 'none').")
    limit: int | None = Field(None, ge=1, description="Score only the first this many documents of each task (None: all).")
    num_fewshot: int | None = Field(None, ge=0, description="Few-shot examples per prompt (None: the task's default, else 0).")
    apply_chat_template: bool = Field(False, description="Format prompts with the model's chat template.")
    batch_size: int = Field(8, ge=1, description="Requests per forward pass (or concurrent requests to an endpoint).")
    max_length: int | None = Field(None, ge=16, description="Longest context in tokens (None: lm-eval's default for the model).")
    seed: int = Field(0, description="Seed of lm-eval's random, numpy, torch and few-shot sampling.")
    runtime: evalkit.Runtime = Field("auto", description=evalkit.RUNTIME_HELP + " (lm-eval supports transformers and endpoint).")
    endpoint: str | None = Field(None, description=evalkit.ENDPOINT_HELP)
    endpoint_model: str | None = Field(None, description=evalkit.ENDPOINT_MODEL_HELP)


def is_yaml(task: str) -> bool:
    return task.endswith((".yaml", ".yml"))


@register("eval", "lm_eval")
class LmEval(EvalBackend):
    Options = LmEvalOptions
    requires = ("lm-eval", "torch", "transformers")
    extra = "eval"

    def check(self, options: LmEvalOptions, ctx: PlanContext) -> list[Problem]:
        problems = evalkit.check_runtime(options, ctx)
        base = ctx.recipe.path.parent
        if options.runtime == "onnxruntime":
            problems.append(ctx.problem("lm_eval runs with runtime auto, transformers or endpoint", "runtime"))
        if is_yaml(options.task) and not (base / options.task).expanduser().is_file():
            problems.append(ctx.problem(f"task YAML not found: {base / options.task}", "task"))
        if options.data is not None:
            problem = datasets.check_spec(options.data, base)
            path = datasets.resolve(options.data, base) if problem is None else None
            if problem is None and (path is None or path.suffix not in DATA_BUILDERS):
                problem = f"data must be a local {', '.join(DATA_BUILDERS)} file (got {options.data!r})"
            if problem:
                problems.append(ctx.problem(problem, "data"))
        if package_version("lm-eval") is None:
            problems.append(ctx.problem("lm-eval is not installed", "kind", hint="pip install 'llmopt[eval]'", severity="warning"))
        return problems

    def run(self, options: LmEvalOptions, ctx: StageContext) -> dict:
        lm_eval = require("lm_eval", "eval", "the lm_eval eval")
        from lm_eval.tasks import TaskManager

        if ctx.model_format != "hf":
            raise StageFailed(f"lm_eval scores Hugging Face model folders, not {ctx.model_format}", where=ctx.name,
                              fix="score this model with multiple_choice / generation, or through an endpoint")
        spec, local = task_spec(options, ctx.recipe.path.parent)
        ctx.progress("indexing lm-eval tasks" if not local else "loading the task")
        manager = TaskManager(include_defaults=not local)
        model = build_model(options, ctx)
        ctx.progress(f"running {options.task}")
        try:
            results = lm_eval.simple_evaluate(
                model=model, tasks=[spec], task_manager=manager, limit=options.limit, num_fewshot=options.num_fewshot,
                log_samples=True, bootstrap_iters=0, apply_chat_template=options.apply_chat_template,
                random_seed=options.seed, numpy_random_seed=options.seed, torch_random_seed=options.seed,
                fewshot_random_seed=options.seed)
        except (ConnectionError, OSError, KeyError, ValueError) as exc:
            raise StageFailed(f"lm-eval could not run {options.task!r}: {type(exc).__name__}: {exc}", where=ctx.name,
                              fix="offline, give the task a local data file (data = \"...jsonl\") or a task YAML with local data_files") from None
        rows = sample_rows(results, options)
        evalkit.write_scores(ctx.out_dir, rows)
        return {
            "metric": options.metric,
            "value": evalkit.mean(r["score"] for r in rows),
            "higher_is_better": higher_is_better(results, options.metric),
            "n": len(rows),
            "tasks": sorted({r["task"] for r in rows}),
            "runtime": "endpoint" if options.runtime == "endpoint" else "transformers",
            "lm_eval": package_version("lm-eval"),
            "scores": "scores.jsonl",
        }


def task_spec(options: LmEvalOptions, base: Path) -> tuple[str | dict, bool]:
    """What simple_evaluate gets (a task name or a full config dict), and whether it is local."""
    from lm_eval.tasks._yaml_loader import load_yaml

    if is_yaml(options.task):
        path = (base / options.task).expanduser().resolve()
        config = load_yaml(path, resolve_func=True)
        config["dataset_kwargs"] = resolved_kwargs(config.get("dataset_kwargs"), path.parent)
    elif options.data is not None:
        from lm_eval.tasks import TaskManager

        entry = TaskManager().task_index.get(options.task)
        if entry is None or entry.yaml_path is None:
            raise StageFailed(f"lm-eval has no task YAML named {options.task!r} to feed local data to",
                              fix="give a task name `lm-eval ls tasks` lists, or a local task YAML")
        config = load_yaml(entry.yaml_path, resolve_func=True)
    else:
        return options.task, False
    if options.data is not None:
        data = datasets.resolve(options.data, base)
        split = "test"
        config.update(dataset_path=DATA_BUILDERS[data.suffix], dataset_name=None, test_split=split,
                      validation_split=None, training_split=None, fewshot_split=None,
                      dataset_kwargs={"data_files": {split: str(data)}})
    return config, True


def resolved_kwargs(kwargs: dict | None, folder: Path) -> dict | None:
    """``dataset_kwargs`` with relative ``data_files`` made relative to the YAML's folder."""
    if not kwargs or "data_files" not in kwargs:
        return kwargs

    def fix(value):
        if isinstance(value, str):
            return value if "://" in value or Path(value).is_absolute() else str(folder / value)
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    return dict(kwargs, data_files=fix(kwargs["data_files"]))


def build_model(options: LmEvalOptions, ctx: StageContext):
    """lm-eval's model: HFLM in-process, or its local-completions client of the endpoint."""
    trust = ctx.recipe.recipe.model.trust_remote_code
    extra = {"max_length": options.max_length} if options.max_length else {}
    if options.runtime == "endpoint":
        from lm_eval.models.openai_completions import LocalCompletionsAPI

        from llmopt.runtimes.endpoint import EndpointRuntime

        served = EndpointRuntime(ctx.model_dir, url=options.endpoint, served_model=options.endpoint_model,
                                 trust_remote_code=trust)
        return LocalCompletionsAPI(base_url=served.url + "/completions", model=served.model,
                                   tokenizer=str(ctx.model_dir), tokenizer_backend="huggingface",
                                   num_concurrent=options.batch_size, trust_remote_code=trust, **extra)
    from lm_eval.models.huggingface import HFLM

    dtype = "bfloat16" if ctx.device.startswith("cuda") else "float32"
    return HFLM(pretrained=str(ctx.model_dir), device=ctx.device, dtype=dtype, batch_size=options.batch_size,
                trust_remote_code=trust, **extra)


def sample_rows(results: dict, options: LmEvalOptions) -> list[dict]:
    """One row per document of every task, with the chosen metric as ``score``."""
    rows = []
    for task, samples in sorted((results or {}).get("samples", {}).items()):
        filters = [s.get("filter") for s in samples]
        wanted = options.filter or (filters[0] if filters else None)
        for sample in samples:
            if sample.get("filter") != wanted:
                continue
            if options.metric not in sample:
                known = ", ".join(sample.get("metrics") or [])
                raise StageFailed(f"task {task} reports no per-example {options.metric!r}",
                                  fix=f"set metric to one it reports: {known}")
            value = sample[options.metric]
            if not isinstance(value, (int, float)):
                raise StageFailed(f"{task}: {options.metric} is not a number per example ({type(value).__name__})",
                                  fix="pick a metric averaged over examples, such as acc or exact_match")
            row = {"id": f"{task}/{sample['doc_id']}", "score": float(value), "task": task, "doc_id": sample["doc_id"]}
            rows.append(row | choice_logliks(sample))
    if not rows:
        raise StageFailed(f"lm-eval returned no samples for {options.task!r}",
                          fix="check the task's data and filter (filter = the name of one of its filters)")
    return rows


def choice_logliks(sample: dict) -> dict:
    """``{"loglik": [...]}``: each choice's log-likelihood of a log-likelihood task's sample (lm-eval's
    ``filtered_resps``, one ``[loglik, is_greedy]`` a choice), as llmopt's multiple_choice rows carry it; else {}."""
    resps = sample.get("filtered_resps")
    if not resps or not all(isinstance(r, (list, tuple)) and len(r) == 2 and isinstance(r[1], bool) for r in resps):
        return {}
    return {"loglik": [round(float(r[0]), 5) for r in resps]}


def higher_is_better(results: dict, metric: str) -> bool:
    flags = [v.get(metric) for v in (results.get("higher_is_better") or {}).values() if isinstance(v, dict)]
    known = [f for f in flags if f is not None]
    return bool(known[0]) if known else True
