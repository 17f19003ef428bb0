"""The ops kda-contracts ships, one package each, built on the engine's public API:
``packed_decode`` (KDA, Kimi-Linear). Each holds its contract, hints, mistakes catalogue,
diagrams, dump report, custom op and demo; its kernels live in ``kda_kernels``."""
