"""KDA packed-decode kernels, installed under the import name ``kda_kernels``.

One module per backend: ``reference`` (PyTorch), ``triton_decode`` (Triton),
``helion_decode`` (Helion). The kernels assume their inputs were already validated
by :mod:`kda_contracts`; this package imports nothing heavy at import time.
"""
