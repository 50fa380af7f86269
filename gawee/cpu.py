"""This CPU's facts as /proc/cpuinfo states them: its fields, and whether its int8 arithmetic multiplies 8-bit
activations exactly. A leaf: the rule library's ``int8_levels()`` reads it, as :mod:`gawee.machine` (timing, bf16)
and the cache do."""

from __future__ import annotations


def cpu_info() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (``model name``, ``flags``...; they describe them all);
    empty where there is none (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
"""x86 flags (``/proc/cpuinfo``) of VNNI: u8 x s8 products summed straight into 32-bit integers."""


def no_vnni() -> str | None:
    """Why this CPU's int8 kernels cannot multiply 8-bit activations exactly, or None where they can (an x86 CPU
    with :data:`VNNI_FLAGS`). Without VNNI, fbgemm's and oneDNN's u8 x s8 kernels add pairs of products in 16
    bits, which saturate for activations past 127: their dynamic linear then quantizes activations to 7 bits
    (``reduce_range``). Where nothing says (no ``/proc/cpuinfo``) the answer is the cautious one."""
    info = cpu_info()
    if any(flag in info.get("flags", "").split() for flag in VNNI_FLAGS):
        return None
    if "flags" not in info:
        return "nothing says this CPU has VNNI (no x86 flags in /proc/cpuinfo)"
    return f"this CPU has no VNNI (neither of {', '.join(VNNI_FLAGS)} among /proc/cpuinfo's flags)"
