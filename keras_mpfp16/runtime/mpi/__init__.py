"""The MPI layer: the communicator (`world`), the numpy collectives
(`collectives`), the 16-bit wire format (`wire`), CUDA-aware MPI (`cuda`).

Imports `process` below it, nothing above.
"""
