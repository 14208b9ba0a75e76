"""`python -m keras_mpfp16 doctor` on a seamed GPU node (no GPU here).

Every rank sees `CUDA_VISIBLE_DEVICES=0` and TensorFlow computes on one GPU,
as under `srun --gpus-per-task=1`. The CUDA driver is a stand-in
(tests/fake_cuda.py): with `bound`, each local rank's device 0 is a GPU of
its own (its own UUID and PCI bus id: per-task binding); with `shared`,
every rank's device 0 is the same GPU (true sharing).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from fake_cuda import FakeCudaDriver, uuid_bytes  # noqa: E402

from keras_mpfp16.backend import devices  # noqa: E402
from keras_mpfp16.runtime.process import (
    gpus,  # noqa: E402
    launcher_env,  # noqa: E402
)

mode = sys.argv[1]
os.environ["CUDA_VISIBLE_DEVICES"] = "0"
local = launcher_env.detect().local_rank or 0
gpu = local if mode == "bound" else 0
gpus.node_gpus = lambda: 4
gpus.cuda_driver = lambda: FakeCudaDriver(
    [(uuid_bytes(gpu), f"00000000:{0x18 + gpu:02X}:00.0")]
)
devices.gpu_query = lambda: ["/physical_device:GPU:0"]
devices.cuda_build_query = lambda: True

from keras_mpfp16 import doctor  # noqa: E402

sys.exit(doctor.main(["--large-mb", "1"]))
