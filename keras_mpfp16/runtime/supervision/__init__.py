"""Supervision: ending hangs and failures, agreeing on stops.

The stall inspector (`stall`, `stall_messages`, `stall_diagnosis`), abort on
failure (`failure`), the rendezvous (`rendezvous`), the preemption agreement
(`preemption`), atomic files (`atomic_files`), the job's services started at
`init` (`services`), and the launch wrapper (`launch_wrapper`, run as
`python -m keras_mpfp16.runtime.launch mpirun ...`).

The top of the runtime: may import `trace`, `mpi` and `process`.
"""
