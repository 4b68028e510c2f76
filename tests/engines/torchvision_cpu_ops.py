"""Lets the PyPI torchvision wheel (built against CUDA torch) import next to the CPU torch build.

Its ``_C`` extension needs libtorch_cuda and does not load; torchvision then still registers fake kernels for
``torchvision::nms`` / ``qnms`` and fails with "operator torchvision::nms does not exist". transformers and SGLang
only need torchvision's Python transforms, so the two operator schemas are declared (no kernels) before the first
``import torchvision``. Installed into the engines venv by tests/engines/setup_venv.sh through a .pth file.
"""

import importlib.abc
import importlib.util
import sys


class _DeclareOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torchvision")
        if spec is not None and spec.origin:
            import os

            import torch

            try:
                torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
            except (OSError, RuntimeError):
                lib = torch.library.Library("torchvision", "DEF")
                lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                _KEEP.append(lib)  # a Library deregisters its definitions when collected
        return spec


_KEEP = []
sys.meta_path.insert(0, _DeclareOps())
