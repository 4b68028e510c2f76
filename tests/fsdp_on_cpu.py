"""Run `eagle3-hub train` under accelerate's FSDP on CPU processes (gloo), for the FSDP tests.

    accelerate launch --config_file recipes/accelerate/fsdp.yaml --num_processes 2 --mixed_precision no \
        tests/fsdp_on_cpu.py --config RECIPE

accelerate (1.16) builds its FSDP state only on accelerator devices: in ``AcceleratorState.__init__`` the FSDP
plugin is taken for ``MULTI_GPU``/``MULTI_XPU``/... alone, so CPU processes run as ``MULTI_CPU`` (DDP), and
without ``--cpu`` as unconnected single processes. This shim lifts that one check: the processes start as
``MULTI_CPU`` (gloo), then the state becomes ``FSDP`` with the plugin accelerate built from the config. Everything
after it (``fully_shard`` wrapping, gradient clipping, ``save_state``/``load_state``, ``get_state_dict``) is
accelerate's own FSDP2 code, the code a GPU run takes.
"""

from __future__ import annotations

import os
import sys

import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

_init = AcceleratorState.__init__


def _init_fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
    _init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        if self._mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.fsdp_plugin = fsdp_plugin
        PartialState._shared_state["distributed_type"] = self.distributed_type  # as accelerate does for GPUs


def main() -> int:
    if not torch.cuda.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "true"  # gloo process group, CPU device
        AcceleratorState.__init__ = _init_fsdp_on_cpu
    from eagle3_hub.commands.train import main as train_main

    return train_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
