"""Achieved TFLOP/s of a compiled step and the fraction of the device's peak it reaches.

The FLOP count is XLA's cost analysis of the compiled step (`Compiled.cost_analysis()`,
two FLOPs per multiply-add). Peaks are NVIDIA's datasheet figures for dense math (half
the "with sparsity" figures), in TFLOP/s. A device not in the table gets TFLOP/s
without a fraction.
"""
import re

# (regular expression searched in jax's device_kind, in this order): {math: dense TFLOP/s}
PEAK_TFLOPS = (
    (r"H200 NVL", {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H200", {"bf16": 989.5, "tf32": 494.5, "fp32": 67.0}),    # also GH200 (Hopper)
    (r"H100 NVL", {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (r"H100", {"bf16": 989.5, "tf32": 494.5, "fp32": 67.0}),    # SXM, e.g. "H100 80GB HBM3"
    (r"A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3}),
)


def device_peaks(device_kind):
    """{math: dense peak TFLOP/s} of a jax device_kind, or None when it is not in the table."""
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_kind, re.IGNORECASE):
            return peaks
    return None


def float32_math():
    """The math float32 matmuls run in here: 'tf32' on an NVIDIA GPU at JAX's default
    precision, 'fp32' where jax_default_matmul_precision asks for full float32."""
    import jax
    precision = str(jax.config.jax_default_matmul_precision or "default").lower()
    if jax.default_backend() == "gpu" and precision not in ("highest", "float32"):
        return "tf32"
    return "fp32"


def achieved(flops, seconds, device_kind, math):
    """{'tflops': achieved TFLOP/s, 'peak_tflops', 'fraction' (None for an unknown device)}."""
    tflops = flops / seconds / 1e12
    peaks = device_peaks(device_kind)
    peak = peaks[math] if peaks else None
    return {"tflops": tflops, "math": math, "peak_tflops": peak,
            "fraction": tflops / peak if peak else None}


def describe(a):
    """'12.3 TFLOP/s (2.5% of the dense tf32 peak)' or '0.12 TFLOP/s'."""
    text = f"{a['tflops']:.3g} TFLOP/s"
    if a["fraction"] is not None:
        text += f" ({a['fraction']:.1%} of the dense {a['math']} peak, {a['peak_tflops']:g})"
    return text
