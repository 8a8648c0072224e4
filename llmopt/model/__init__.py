"""Facts about a model that the plan and the stages share, read from config files, never weights: its
config facts and hub id, checkpoint formats, the size model, the serving memory model, the compress
and the compress placement."""
