"""Deploy stage helpers shared by the serve backends (``llmopt/backends/serve/``).

* ``compat``: the rule a consumer declares per checkpoint format, and the planner's verdict on
  format x consumer x GPU compute capability (the facts live in each serve backend's file);
* ``inputs``: model facts, weight bytes and the memory model's plan for an engine;
* ``files``: docker-compose.yaml, kubernetes.yaml and launch.sh for an engine's launch.

The numbers come from ``llmopt.model.memory``; the engine-specific flags and their versioned
flag tables live in each backend's own file.
"""
