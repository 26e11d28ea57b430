"""Suite-wide setup: no test writes into the user's real compilation cache.

The variable is set before any test imports progdesc, and the subprocesses and
notebook kernels that tests start inherit it. Tests of the cache itself turn it
back on in their own subprocesses, at a temporary directory.
"""
import os

os.environ["PROGDESC_COMPILATION_CACHE"] = "0"
