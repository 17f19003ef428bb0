import os

# The Triton interpreter must be selected before any @triton.jit function runs.
os.environ.setdefault("TRITON_INTERPRET", "1")
