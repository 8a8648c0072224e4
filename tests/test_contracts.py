"""Contracts every backend, shipped recipe and doc must keep."""

from __future__ import annotations

import inspect
import sys

import pytest

import textwrap

from pydantic import ValidationError

from llmopt import docgen, registry

from llmopt.model import formats
from llmopt.backends.base import CONTRACTS, CompressBackend, Options, PlanContext

from conftest import ROOT

BACKENDS = [(kind, name, cls) for kind, items in registry.all_backends().items() for name, cls in items.items()]
PRODUCERS = [b for b in BACKENDS if b[0] in ("compress", "export")]



def default_options(cls):
    """The backend's options with their defaults (unvalidated when some option has none)."""
    try:
        return cls.Options()
    except ValidationError:
        return cls.Options.model_construct()


CONSUMERS = [b for b in BACKENDS if b[0] == "serve" or (b[0] == "export" and b[2]().accepts(default_options(b[2])) is not None)]


@pytest.mark.parametrize("kind,name,cls", BACKENDS, ids=[f"{k}:{n}" for k, n, _ in BACKENDS])
def test_backend_contract(kind, name, cls):
    module = sys.modules[cls.__module__]
    assert module.__doc__ and "Needs" in module.__doc__, f"{cls.__module__} needs a top docstring saying what it needs"
    assert cls.Options.model_config.get("extra") == "forbid"
    for field_name, field in cls.Options.model_fields.items():
        assert field.description, f"{kind}:{name} option {field_name!r} has no description"
    contract = CONTRACTS[kind]
    assert issubclass(cls, contract) and not inspect.isabstract(cls)
    assert isinstance(cls.requires, tuple) and isinstance(cls.version, int)
    # every capability the class states is one its contract declares, of the declared type
    stated = {k: v for k, v in vars(cls).items() if not k.startswith("_") and not callable(v)
              and not isinstance(v, (staticmethod, classmethod, property)) and k != "Options"}
    undeclared = sorted(set(stated) - set(dir(contract)))
    assert not undeclared, f"{kind}:{name} states {undeclared}, which llmopt.backends.base does not declare"
    for key, value in stated.items():
        default = getattr(contract, key)
        assert default is None or isinstance(value, type(default)), f"{kind}:{name}.{key} = {value!r}"


@pytest.mark.parametrize("kind,name,cls", PRODUCERS, ids=[f"{k}:{n}" for k, n, _ in PRODUCERS])
def test_compress_and_export_backends_declare_what_they_produce(kind, name, cls):
    produced = cls().produces(default_options(cls))
    assert produced in formats.ALL or produced == formats.AS_INPUT, f"{kind}:{name} produces {produced!r}"
    if produced != formats.AS_INPUT and kind == "export":
        assert cls().accepts(default_options(cls)) is not None, \
            f"export {name} writes a new format but declares nothing it accepts"


@pytest.mark.parametrize("kind,name,cls", CONSUMERS, ids=[f"{k}:{n}" for k, n, _ in CONSUMERS])
def test_consumers_declare_a_rule_for_every_format(kind, name, cls):
    """A format missing from a consumer's declaration would skip its checks (a warning says so at plan time)."""
    rules = cls().accepts(default_options(cls))
    missing = [f.name for f in formats.ALL if f not in rules]
    assert not missing, f"{kind}:{name} declares nothing about {missing}"
    assert set(rules) <= set(formats.ALL), f"{kind}:{name} names formats outside llmopt.model.formats"


def test_every_serve_backend_and_the_onnx_export_are_consumers():
    assert {(k, n) for k, n, _ in CONSUMERS} == {("serve", n) for n in registry.names("serve")} | {("export", "onnx")}


@pytest.mark.parametrize("method,options,expected", [
    ("gptq", {}, formats.CT_W4A16),
    ("gptq", {"actorder": "group"}, formats.CT_W4A16_GIDX),
    ("gptq", {"scheme": "W8A16"}, formats.CT_W8A16),
    ("gptq", {"scheme": "W8A8"}, formats.CT_INT8),
    ("rtn", {"bits": 8}, formats.CT_W8A16),
    ("rtn", {"bits": 3}, formats.CT_WNA16),
    ("int8_sq", {}, formats.CT_INT8),
    ("modelopt_int8_sq", {}, formats.MODELOPT_INT8_SQ),
    ("sparsegpt", {}, formats.SPARSE_2_4),
])
def test_options_that_change_the_format(method, options, expected):
    cls = registry.get("compress", method)
    assert cls().produces(cls.Options(**options)) == expected


def test_the_onnx_export_declares_by_execution_provider_and_precision():
    cls = registry.get("export", "onnx")
    cpu, cuda = cls().accepts(cls.Options()), cls().accepts(cls.Options(execution_provider="cuda"))
    assert cpu[formats.CT_FP8].status == "no" and cuda[formats.CT_FP8].status == "yes"
    assert cls().accepts(cls.Options(precision="fp16"))[formats.CT_W4A16].status == "no"
    for rules in (cpu, cuda):
        assert rules[formats.CT_INT8] == rules[formats.MODELOPT_INT8_SQ]  # both quantize activations
        assert "quantizes activations" in rules[formats.MODELOPT_INT8_SQ].note
    assert cls().produces(cls.Options(precision="int8")) == formats.ONNX_INT8


@pytest.mark.parametrize("kind,lacking", [("compress", "produces"), ("export", "produces"), ("serve", "accepts"),
                                          ("eval", "run"), ("source", "fingerprint")])
def test_registering_a_backend_without_its_declaration_raises(kind, lacking):
    contract = CONTRACTS[kind]
    attrs = {attr: lambda self, *a: None for attr in contract.__abstractmethods__ if attr != lacking}
    attrs["Options"] = default_options.__class__  # not an options model either: the missing method is named first
    with pytest.raises(TypeError, match=f"does not define {lacking}"):
        registry.register(kind, "undeclared")(type("Undeclared", (contract,), attrs))
    assert "undeclared" not in registry.names(kind)


@pytest.mark.parametrize("kind,other", [("compress", "export"), ("serve", None)])
def test_registering_a_class_of_another_contract_or_none_raises(kind, other):
    base = (CONTRACTS[other],) if other else ()
    with pytest.raises(TypeError, match=f"must subclass the {kind} contract"):
        registry.register(kind, "misfiled")(type("Misfiled", base, {}))
    assert "misfiled" not in registry.names(kind)


def test_a_new_hessian_method_is_one_class(tmp_path):
    """A compress method that builds Hessians declares it, and the compress placement counts them: the same
    memory as GPTQ's, more than the same method without them. Nothing else names the method."""
    from test_placement import plan_for

    def backend(hessians: bool):
        return type("HessianMethod", (CompressBackend,), {
            "Options": Options, "calibrates": True, "builds_hessians": hessians, "quantizes": True,
            "produces": lambda self, options: formats.CT_W4A16, "check": lambda self, options, ctx: [],
            "run": lambda self, options, ctx: {}})

    placed = {}
    try:
        for name, hessians in (("hessian_method", True), ("hessian_free", False)):
            registry.register("compress", name)(backend(hessians))
        for method in ("gptq", "hessian_method", "hessian_free"):
            plan = plan_for(tmp_path / method, "mixtral-8x7b", 'gpu = "H200"\nhost_ram_gib = 512', method)
            placed[method] = plan.estimates["compress_placement"]["placements"]["onload"]["gpu_bytes"]
    finally:
        for name in ("hessian_method", "hessian_free"):
            registry._REGISTRY["compress"].pop(name, None)
    assert placed["hessian_method"] == placed["gptq"] > placed["hessian_free"]

def test_a_format_a_consumer_does_not_know_is_a_warning():
    from llmopt.deploy import compat

    mxfp4 = formats.Format("mxfp4", "MXFP4 (a third-party format)")
    [problem] = compat.judge({formats.DENSE: compat.YES}, mxfp4, "x output served by y", "here", None)
    assert problem.severity == "warning" and "declares nothing about MXFP4" in problem.message
    assert compat.judge({}, formats.AS_INPUT, "hf output", "here", None) == []
    with pytest.raises(ValueError, match="needs its reason"):
        compat.Rule("no")


def test_a_new_file_in_a_backend_folder_is_a_new_backend(tmp_path, monkeypatch):
    """Discovery: every module of llmopt/backends/<kind>/ not starting with "_" is imported, import errors raise."""
    import llmopt.backends.eval as package

    (tmp_path / "probe_metric.py").write_text(textwrap.dedent('''\
        from llmopt.backends.base import EvalBackend, Options
        from llmopt.registry import register

        @register("eval", "probe_metric")
        class Probe(EvalBackend):
            Options = Options

            def check(self, options, ctx):
                return []

            def run(self, options, ctx):
                return {}
        '''))
    (tmp_path / "_probe_helper.py").write_text("raise RuntimeError('a helper module is not imported by discovery')\n")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_REGISTRY", {kind: {} for kind in registry._REGISTRY})  # modules already imported
    monkeypatch.setattr(registry, "_LOADED", False)  # register nothing again; only the new file does
    try:
        assert "llmopt.backends.eval.probe_metric" in registry.builtin_modules()
        assert registry.names("eval") == ["probe_metric"]
        (tmp_path / "broken_metric.py").write_text("import llmopt_no_such_module\n")
        monkeypatch.setattr(registry, "_LOADED", False)
        with pytest.raises(ModuleNotFoundError, match="llmopt_no_such_module"):
            registry.names("eval")
    finally:
        for name in ("probe_metric", "broken_metric", "_probe_helper"):
            sys.modules.pop(f"llmopt.backends.eval.{name}", None)


def test_every_backend_module_is_discovered():
    modules = set(registry.builtin_modules())
    assert {cls.__module__ for _, _, cls in BACKENDS} <= modules
    assert not any(m.rsplit(".", 1)[1].startswith("_") for m in modules)


def test_duplicate_registration_raises():
    cls = registry.get("eval", "perplexity")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("eval", "perplexity")(type("Other", (), {"Options": cls.Options, "check": 1, "run": 1}))


def test_unknown_backend_suggests():
    from llmopt.errors import UsageError

    with pytest.raises(UsageError, match="did you mean 'perplexity'"):
        registry.get("eval", "perplexty")


def test_generated_docs_are_current():
    stale = [str(p) for p, text in docgen.generated().items() if not p.is_file() or p.read_text() != text]
    assert not stale, f"run `python -m llmopt.docgen` to refresh: {stale}"


def test_readme_names_the_two_commands_and_they_exist():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "llmopt run recipes/quickstart.toml" in makefile
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")
    assert "torch==2.13.0" in makefile  # the CPU build; an unpinned torch pulls CUDA wheels


def test_plan_context_where_points_into_the_recipe(tmp_path):
    from llmopt.recipe import load_recipe

    path = tmp_path / "r.toml"
    path.write_text('schema_version = 1\nname = "x"\n[model]\nsource = "a/b"\n[[eval]]\nname = "p"\nkind = "perplexity"\nwindow = 64\n')
    ctx = PlanContext(recipe=load_recipe(path), step=("eval", 0))
    assert ctx.where("window") == f"{path}:8: eval[0].window"


def test_require_pauses_the_collector_while_importing(tmp_path, monkeypatch):
    import gc

    from llmopt.libraries import require
    from llmopt.errors import MissingExtra

    (tmp_path / "llmopt_probe_module.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llmopt_probe_module", raising=False)
    assert gc.isenabled()
    assert require("llmopt_probe_module", "compress", "a test").COLLECTING is False
    assert gc.isenabled()  # resumed after the import
    with pytest.raises(MissingExtra):
        require("llmopt_no_such_module", "compress", "a test")
    assert gc.isenabled()  # and after a failed one
    gc.disable()
    try:
        require("json", "core", "a test")
        assert not gc.isenabled()  # a collector the caller paused stays paused
    finally:
        gc.enable()


# The layers of the package, lowest first: a module may import its own layer and those below.
LAYERS = [
    ["llmopt", "llmopt.errors", "llmopt.sysinfo", "llmopt.libraries", "llmopt.model.formats", "llmopt.catalog",
     "llmopt.model.modelinfo", "llmopt.output"],
    ["llmopt.recipe", "llmopt.registry", "llmopt.store.cache", "llmopt.data", "llmopt.data.calibration", "llmopt.model.memory",
     "llmopt.scoring.gate", "llmopt.store.verify", "llmopt.model.chat"],
    # the size model asks each backend for its layout, as the planner does; the compress placement uses the
    # size model, and the compress backends follow it
    ["llmopt.runtimes", "llmopt.scoring.evalkit", "llmopt.deploy", "llmopt.deploy.validate_engine", "llmopt.backends",
     "llmopt.model.estimates", "llmopt.model.placement"],
    # the bench stage of a run starts an artifact's server and measures it (llmopt bench is the same code);
    # it finds the model folder as llmopt serve does; the tune stage starts it once per trial
    ["llmopt.plan.stages", "llmopt.plan", "llmopt.bench", "llmopt.tune", "llmopt.server.model"],
    # llmopt eval, and llmopt tune and bench of an artifact, plan their scope and hand it to the runner
    ["llmopt.artifacts.reports", "llmopt.artifacts.artifact", "llmopt.run.runner", "llmopt.run.evaluate",
     "llmopt.run.tune", "llmopt.run.bench"],
    ["llmopt.api", "llmopt.server", "llmopt.sweep"],
    ["llmopt.cli", "llmopt.docgen", "llmopt.__main__"],
]


def layer_of(module: str) -> int | None:
    """The layer of the longest prefix of ``module`` the table names."""
    found = [(len(name), i) for i, names in enumerate(LAYERS) for name in names
             if module == name or module.startswith(name + ".")]
    return max(found)[1] if found else None


def test_no_lower_layer_imports_a_higher_one():
    import ast

    violations, unplaced = [], []
    for path in sorted((ROOT / "llmopt").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mine = layer_of(module)
        if mine is None:
            unplaced.append(module)
            continue
        for node in ast.walk(ast.parse(path.read_text())):  # imports inside functions count too
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmopt"):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("llmopt")]
            else:
                continue
            violations += [f"{module} imports {name}" for name in names if (layer_of(name) or 0) > mine]
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"
    assert not violations
