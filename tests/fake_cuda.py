"""A stand-in for the CUDA driver library (`libcuda.so.1`), for the seam
`keras_mpfp16.runtime.process.gpus.cuda_driver`: it answers the calls
`gpus.gpu_identities` makes through ctypes, for the devices it is given."""

from __future__ import annotations

import ctypes


class FakeCudaDriver:
    """Devices as `(uuid bytes (16), "PCI bus id")`; `init_status` is what
    `cuInit` returns (100: no device visible)."""

    def __init__(self, devices, init_status=0, with_uuid=True):
        self.devices = list(devices)
        self.init_status = init_status
        if not with_uuid:
            self.cuDeviceGetUuid_v2 = None

    def cuInit(self, flags):
        return self.init_status

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.devices)
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDeviceGetUuid_v2(self, raw, device):
        ctypes.memmove(raw, self.devices[device.value][0], 16)
        return 0

    def cuDeviceGetPCIBusId(self, buffer, length, device):
        buffer.value = self.devices[device.value][1].encode()
        return 0


def uuid_bytes(n: int) -> bytes:
    """A distinct 16-byte UUID for GPU number `n`."""
    return bytes([0x5A, n]) + bytes(range(14))
