"""The operator library and the lowering pass (program description -> JAX)."""
