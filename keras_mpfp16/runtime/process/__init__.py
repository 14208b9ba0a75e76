"""Facts about this process before MPI starts: the launcher's variables
(`launcher_env`), thread defaults (`threads`), GPU binding (`gpus`).

The bottom of the runtime: imports nothing of it but the settings registry.
"""
