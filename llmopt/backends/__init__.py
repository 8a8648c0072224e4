"""Backends, one file each. ``BUILTIN`` is the explicit list of built-in modules;
third-party backends register through the ``llmopt.backends`` entry-point group."""

BUILTIN = [
    "llmopt.backends.source.hf",
    "llmopt.backends.source.gguf",
    "llmopt.backends.export.hf",
    "llmopt.backends.eval.perplexity",
]
