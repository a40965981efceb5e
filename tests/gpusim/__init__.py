"""gpusim: a simulated NVIDIA GPU host (device files, nvidia-smi, real holder processes).

See tests/gpusim/README.md.
"""

__version__ = "0.1.0"
