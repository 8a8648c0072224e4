"""Scoring helpers every eval shares: the per-example scores and prompts (``evalkit``) and the paired
comparison and verdicts of the accuracy gate (``gate``)."""
