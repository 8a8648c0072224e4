"""Launch-parameter tuning against the live engine (``[tune]`` and ``llmopt tune``).

``spaces``: what is searched for each engine, where each value lives in the launch config, and the
candidate values (never below the deploy stage's prediction). ``search``: the loop, coordinate
descent within a budget of trials and minutes, each trial's measurement cached so a killed search
resumes. ``stage``: the tune stage of ``llmopt run`` and of ``llmopt tune ARTIFACT`` (a plan of its own,
``llmopt.run.tune``); ``report``: tuning.json, the winner written into ``deploy/<engine>/``, report.md's section and
the plot; ``speculation``: speculative decoding's measured effect and the lossless check of greedy answers
with and without it. docs/tune.md describes it.
"""
