"""``require``: a missing extra, and an installed library that cannot be imported, told apart."""

from __future__ import annotations

import pytest

from llmopt.errors import EXIT_MISSING_EXTRA, MissingDependency, MissingExtra
from llmopt.libraries import require

ABSENT = "llmopt_test_absent_module"  # imported by the throwaway packages below; installed nowhere


def throwaway_package(root, name: str, body: str, distribution: str | None = None) -> None:
    """``root/name/`` whose submodule ``inner`` runs ``body`` on import (the package imports it),
    with a dist-info naming ``distribution`` when given, as pip would install it."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(f"from {name} import inner  # noqa: F401\n")
    (package / "inner.py").write_text(body + "\n")
    if distribution:
        info = root / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        (info / "top_level.txt").write_text(f"{name}\n")


@pytest.fixture()
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_module_that_is_not_installed_is_a_missing_extra(on_path):
    with pytest.raises(MissingExtra) as info:
        require(ABSENT, "compress", "the test stage")
    assert info.value.exit_code == EXIT_MISSING_EXTRA
    assert info.value.what == f"the test stage needs the Python package '{ABSENT}', which is not installed"
    with pytest.raises(MissingExtra):  # a submodule of a package that is not installed: the same
        require(f"{ABSENT}.quantization", "compress", "the test stage", package="absent-dist")


def test_a_dependency_missing_under_an_installed_package_is_named(on_path):
    # the case seen on a GPU machine: modelopt installed, its dependency pulp not
    throwaway_package(on_path, "brokenpkg", f"import {ABSENT}", distribution="broken-pkg")
    with pytest.raises(MissingDependency) as info:
        require("brokenpkg", "modelopt", "the modelopt_fp8 stage", package="broken-pkg")
    err = info.value
    assert err.exit_code == EXIT_MISSING_EXTRA
    assert err.what.startswith("the modelopt_fp8 stage needs 'broken-pkg', which is installed but cannot be imported")
    assert f"the module '{ABSENT}', which is not installed" in err.what
    assert "imported by brokenpkg.inner, package broken-pkg" in err.what
    assert f"pip install {ABSENT}" in err.fix and "pip install 'llmopt[modelopt]'" in err.fix


def test_a_missing_dependency_is_named_without_package_metadata(on_path):
    throwaway_package(on_path, "loosepkg", f"import {ABSENT}.sub")
    with pytest.raises(MissingDependency) as info:
        require("loosepkg", "compress", "the test stage")
    assert f"the module '{ABSENT}', which is not installed" in info.value.what
    assert "imported by loosepkg.inner, package loosepkg" in info.value.what


def test_an_installed_package_whose_import_fails_says_why(on_path):
    throwaway_package(on_path, "clashpkg", "from json import no_such_name")
    with pytest.raises(MissingDependency) as info:
        require("clashpkg", "ort", "the onnx export")
    assert "importing 'clashpkg' failed" in info.value.what
    assert "cannot import name 'no_such_name' from 'json'" in info.value.what
    assert "pip install 'llmopt[ort]'" in info.value.fix


def test_the_cli_reports_a_missing_dependency_with_exit_4(on_path, capsys, monkeypatch, tmp_path):
    from llmopt import libraries
    from llmopt.cli import ls
    from llmopt.cli.main import main

    throwaway_package(on_path, "brokenpkg", f"import {ABSENT}")
    monkeypatch.setattr(ls, "_show", lambda console, doc: libraries.require("brokenpkg", "compress", "ls"))
    assert main(["ls", "gpus"]) == 4
    err = capsys.readouterr().err
    assert f"the module '{ABSENT}', which is not installed" in err and "Traceback" not in err


def test_the_gpu_build_of_onnxruntime_stands_for_the_library(monkeypatch):
    """With onnxruntime-gpu (the ort-cuda extra) in place of onnxruntime, the onnx export's stage was refused
    before it ran: onnxruntime "not installed", exit 4. Both builds install ``import onnxruntime``."""
    from importlib.metadata import PackageNotFoundError

    from llmopt import libraries

    installed = {"onnxruntime-gpu": "1.31.1", "onnxruntime-genai-cuda": "0.18.0", "onnx": "1.21.0"}

    def version(dist):
        if dist not in installed:
            raise PackageNotFoundError(dist)
        return installed[dist]

    monkeypatch.setattr(libraries, "version", version)
    libraries.package_version.cache_clear()
    try:
        assert libraries.package_version("onnxruntime") == "1.31.1"
        assert libraries.package_version("onnxruntime-genai") == "0.18.0"
        assert libraries.package_version("onnx") == "1.21.0" and libraries.package_version("torch") is None
        installed["onnxruntime"] = "1.30.0"  # the CPU build beside it: the GPU build is the one reported
        libraries.package_version.cache_clear()
        assert libraries.package_version("onnxruntime") == "1.31.1"
    finally:
        libraries.package_version.cache_clear()


def test_a_machine_without_gpu_devices_picks_the_cpu_without_importing_torch(tmp_path):
    """``pick_device("auto")`` on a Linux machine with no GPU device node: the CPU, and torch (seconds of import in
    every `llmopt run`, `bench` and `serve` that needs no model) not imported to say so."""
    import subprocess
    import sys

    code = ("import sys; from llmopt import libraries; libraries.GPU_DEVICE_NODES = (sys.argv[1],); "
            "print(libraries.pick_device('auto'), 'torch' in sys.modules)")
    absent = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nvidiactl")], capture_output=True,
                            text=True, check=True)
    assert absent.stdout.split() == ["cpu", "False"]
    (tmp_path / "nvidiactl").touch()  # a device node: torch decides, as before
    present = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nvidiactl")], capture_output=True,
                             text=True, check=True)
    device, imported = present.stdout.split()
    assert imported == "True" and device in ("cpu", "cuda")
