"""llmopt: declarative recipes that compress, evaluate, export and deploy LLMs."""

__version__ = "0.1.0"

# Bumped when a stage's on-disk output changes meaning; part of every cache key.
STAGE_FORMAT = 1
