"""The SGLang harness's own pieces that need no SGLang: the stand-in ``sgl_kernel`` fails
loudly, naming the kernel, and the torchvision fix applies to torchvision 0.28's import."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.real import harness_sglang


def test_the_stand_in_kernel_package_fails_loudly_naming_the_kernel(tmp_path, capfd):
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / "__init__.py").write_text(harness_sglang._SGL_KERNEL_STANDIN)
    spec = importlib.util.spec_from_file_location("sgl_kernel", package / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from_import = module.convert_weight_packed  # what `from sgl_kernel import x` gets
    assert from_import.__name__ == "convert_weight_packed"
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.convert_weight_packed"):
        from_import(1, 2)
    assert f"{harness_sglang.SGL_KERNEL_MARKER}: sgl_kernel.convert_weight_packed" in (
        capfd.readouterr().err
    )
    # dunders are not kernels: importlib must not be fooled
    assert not hasattr(module, "__path_hooks__")
    assert "sgl_kernel" not in sys.modules


def test_the_torchvision_fix_makes_its_registrations_optional(tmp_path):
    init = (
        "import torch\n\nfrom . import extension  # usort:skip  # noqa: F401\n"
        + harness_sglang._TORCHVISION_REGISTRATIONS
        + "    datasets,\n    io,\n)  # usort:skip\n"
    )
    fixed = init.replace(
        harness_sglang._TORCHVISION_REGISTRATIONS, harness_sglang._TORCHVISION_TOLERANT, 1
    )
    assert "except RuntimeError:" in fixed
    assert "from torchvision import (\n    datasets,\n    io,\n)" in fixed
    compile(fixed, "__init__.py", "exec")  # still valid Python
