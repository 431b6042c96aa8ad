"""aisim: predict how an LLM inference deployment behaves before anyone rents the GPUs.

The command line lives in ``aisim.cli``; the Python API in ``simulator.replay``.
"""

__version__ = "0.1.0"
