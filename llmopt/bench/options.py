"""What one benchmark run does: the load points, how many requests, what is sent.

The workload (prompt and output lengths, the default concurrency) and the SLO are the
recipe's own ``[serve].workload`` and ``[serve].slo`` models, so a recipe, an artifact's
manifest and the command line describe them alike.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from llmopt.recipe.schema import SLO, Workload

__all__ = ["BenchOptions", "SLO", "Workload"]

class BenchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] = Field(
        default_factory=list, description="Fixed-concurrency points (requests in flight); empty with no rate and no "
        "sweep: the workload's concurrency.")
    rate: list[float] = Field(
        default_factory=list, description="Poisson-arrival points, in requests per second (open loop: arrivals do not "
        "wait for answers).")
    sweep: bool = Field(False, description="Concurrency 1, 2, 4, ... until throughput stops growing (saturation), "
                        "errors pass 10%, or max_concurrency.")
    max_concurrency: int = Field(256, ge=1, description="Highest concurrency a sweep tries.")
    requests: Union[Annotated[int, Field(ge=1)], list[Annotated[int, Field(ge=1)]]] = Field(
        64, description="Measured requests per point (a sweep sends at least 2 x concurrency), or one count per fixed "
        "point, in order: the concurrency points, then the rate points ([16, 128] with concurrency [1, 32]: one in "
        "flight needs fewer requests than a loaded point to be measured, and takes longest per request).")
    warmup: int = Field(4, ge=0, description="Requests sent before each point's measured ones, in the same stream of load, and left out (at a concurrency point at least the concurrency: one round, so that measuring starts in steady state).")
    repeats: int = Field(1, ge=1, description="Repeats of each point; the point's figures are the medians.")
    endpoint: Literal["completions", "chat"] = Field(
        "completions", description="/v1/completions (token-id prompts when the vocabulary is known) or "
        "/v1/chat/completions (text prompts).")
    model: Optional[str] = Field(None, description="Model name sent in requests (default: the first of GET /v1/models).")
    ignore_eos: Optional[bool] = Field(
        None, description="Send ignore_eos so every answer has output_len tokens; default: with random prompts, yes "
        "for vLLM, SGLang, TensorRT-LLM and llmopt serve (from /v1/models owned_by), no otherwise (OpenAI's API "
        "rejects it); with a text workload (dataset), no: answers end where the model ends them.")
    vocab_size: Optional[int] = Field(
        None, ge=16, description="Vocabulary size for token-id prompts (default: the model folder's config.json; "
        "a URL without it gets text prompts).")
    tokenizer: Optional[str] = Field(
        None, description="Model folder whose tokenizer and chat template count and render a dataset's prompts "
        "(default: the target folder's model; a URL without it: lengths from the records' own counts, and the "
        "server's usage figures).")
    request_timeout_s: float = Field(600.0, gt=0, description="Longest wait for one request, in seconds.")
    startup_timeout_s: float = Field(1200.0, gt=0, description="Longest wait for a started engine to answer /health.")
    engine: Literal["auto", "llmopt", "ort", "vllm", "sglang", "trtllm"] = Field(
        "auto", description="For a folder target: what to start. auto: the artifact's deploy/<engine>/launch.sh "
        "(vllm, sglang, trtllm, ort), else llmopt serve.")
    port: Optional[int] = Field(None, ge=1, le=65535, description="Port of a started engine (default: a free one).")
    split: Optional[list[int]] = Field(
        None, description="Prompt lengths of the prefill / decode split (prompt and decode tokens/s, one request at a "
        "time). None: 128, 512 and 2048 against llmopt serve (those that fit its context), none against other "
        "servers; []: no split.")
    split_requests: int = Field(3, ge=1, description="Requests at each prompt length of the split.")
    split_output_len: int = Field(32, ge=2, description="Output tokens of each split request.")
    seed: int = Field(0, description="Seed of prompts and Poisson arrivals.")
    plots: bool = Field(True, description="Write PNG plots (needs matplotlib, the bench extra).")

    def points(self, workload: Workload) -> list[tuple[str, float]]:
        """The fixed load points, in order: ("concurrency", c) and ("rate", r); a sweep adds its own."""
        if self.sweep:
            return []
        points = [("concurrency", float(c)) for c in self.concurrency] + [("rate", float(r)) for r in self.rate]
        return points or [("concurrency", float(workload.concurrency))]

    def point_requests(self, workload: Workload) -> list[int]:
        """The measured requests of each fixed point (``points``), in order: ``requests`` for every point, or
        its own count where ``requests`` is a list, which must name one per point."""
        from llmopt.errors import UsageError

        points = self.points(workload)
        if isinstance(self.requests, int):
            return [self.requests] * len(points)
        if self.sweep:
            raise UsageError("a sweep takes one request count (it sends at least 2 x concurrency a point)",
                             fix="pass one number to -n, or fixed points with -c and a count for each")
        if len(self.requests) != len(points):
            counted = f"{len(points)} load point" + ("s" if len(points) != 1 else "")
            raise UsageError(f"-n gives {len(self.requests)} request counts for {counted}",
                             fix="give one count per point, in order (-c 1,8,32 -n 16,128,128), or one for all")
        return list(self.requests)
