"""Backends, one file each: ``llmopt/backends/<kind>/<name>.py`` registers itself with
``llmopt.registry.register``. The registry imports every module here whose name does not
start with "_" (``_name.py`` holds helpers the backends of a kind share); third-party
backends register through the ``llmopt.backends`` entry-point group."""
