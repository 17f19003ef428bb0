"""The version of kda-contracts (one place: the package and the dumps it writes read it here)."""

__version__ = "0.1.0.dev0"
