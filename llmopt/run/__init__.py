"""Running a plan: the runner (each stage from the cache or run, then the artifact or the reports), and
`llmopt eval` / `llmopt gate` over it."""
