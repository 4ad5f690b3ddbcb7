"""Model FLOPs utilisation of the actor update, as the benchmarks compute it: 6 x parameters x
tokens per second (forward and backward of a dense decoder, attention left out), over the
device's dense bfloat16 peak. Reported only on GPUs whose peak is known here."""

from __future__ import annotations

# Dense bfloat16 tensor-core peaks, TFLOP/s, from the vendors' data sheets (SXM parts).
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "H800": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "A10G": 70.0,
    "A10": 125.0,
    "L4": 121.0,
    "RTX 4090": 165.0,
    "B200": 2250.0,
}


def peak_tflops(device_name: str) -> float | None:
    """The peak of the first known GPU name found in ``device_name`` (longest names first: "L40S" before "L40")."""
    for name in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if name in device_name:
            return PEAK_BF16_TFLOPS[name]
    return None


def mfu(parameters: int, tokens: int, seconds: float, peak: float | None) -> float | None:
    """The fraction of ``peak`` TFLOP/s that ``tokens`` trained in ``seconds`` by 6N used."""
    if not peak or seconds <= 0:
        return None
    return 6.0 * parameters * tokens / seconds / (peak * 1e12)
