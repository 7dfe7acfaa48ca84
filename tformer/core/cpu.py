"""Which CPU a number was measured on: the vendor, the family and model, the microarchitecture
where it is known, and the widest vector instructions NumPy can use.

A model name alone does not say it: a cloud machine reports "Intel(R) Xeon(R) Processor" or
"AMD EPYC" for every generation. The family and model numbers do (``/proc/cpuinfo``, from the
CPUID instruction), and the vector width decides how fast NumPy's and BLAS's loops are: an
AVX-512 core does twice the float32 multiply-adds per cycle of an AVX2 core, in BLAS and in
PyTorch alike, while NumPy's elementwise passes stay bound by memory traffic.
"""
import platform

VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}

# (vendor, family) -> [(first model, last model, name)]. Server and recent desktop parts only;
# a CPU not listed is described by its family and model numbers, which are always recorded.
MICROARCHITECTURES = {
    ("Intel", 6): [(85, 85, "Skylake-SP / Cascade Lake"), (106, 106, "Ice Lake-SP"),
                   (143, 143, "Sapphire Rapids"), (151, 154, "Alder Lake"),
                   (173, 173, "Granite Rapids"), (183, 191, "Raptor Lake"),
                   (207, 207, "Emerald Rapids")],
    ("AMD", 23): [(1, 1, "Zen (Naples)"), (49, 49, "Zen 2 (Rome)"), (113, 113, "Zen 2")],
    ("AMD", 25): [(0, 15, "Zen 3"), (16, 31, "Zen 4"), (32, 95, "Zen 3"), (96, 127, "Zen 4"),
                  (160, 175, "Zen 4c")],
    ("AMD", 26): [(0, 255, "Zen 5")],
}

# The widest first: what the name of each level requires among the flags.
SIMD_LEVELS = (("AVX-512", ("avx512f",)), ("AVX2", ("avx2", "fma")), ("SSE4.2", ("sse4_2",)))


def parse_cpuinfo(text):
    """The first processor's entry of ``/proc/cpuinfo`` text as a dict: ``cpu`` (model name),
    ``vendor`` (Intel, AMD, or the raw vendor id), ``family``, ``model`` (ints),
    ``microarchitecture`` (None where not in ``MICROARCHITECTURES``) and ``simd`` (the widest of
    ``SIMD_LEVELS`` the flags allow, None where none). Keys that the text lacks are left out."""
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break                                   # the end of the first processor's entry
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    info = {}
    if "model name" in fields:
        info["cpu"] = fields["model name"]
    if "vendor_id" in fields:
        info["vendor"] = VENDORS.get(fields["vendor_id"], fields["vendor_id"])
    for key, name in (("cpu family", "family"), ("model", "model")):
        if fields.get(key, "").isdigit():
            info[name] = int(fields[key])
    if {"vendor", "family", "model"} <= info.keys():
        info["microarchitecture"] = next(
            (name for lo, hi, name in MICROARCHITECTURES.get((info["vendor"], info["family"]), ())
             if lo <= info["model"] <= hi), None)
    if "flags" in fields:
        flags = set(fields["flags"].split())
        info["simd"] = next((level for level, need in SIMD_LEVELS if flags.issuperset(need)), None)
    return info


def identify(path="/proc/cpuinfo"):
    """``parse_cpuinfo`` of this machine; ``{"cpu": platform.processor() or None}`` where the file
    cannot be read (not Linux)."""
    try:
        with open(path) as f:
            info = parse_cpuinfo(f.read())
    except OSError:
        info = {}
    if "cpu" not in info:
        info["cpu"] = platform.processor() or None
    return info


def label(machine):
    """One line for a reader: "Intel(R) Xeon(R) Processor (Intel Emerald Rapids, family 6 model
    207, AVX-512)". A record written before the family and model were kept gives its model name
    and says so."""
    name = machine.get("cpu") or "unknown CPU"
    if "family" not in machine:
        return f"{name} (family and model not recorded)"
    arch = machine.get("microarchitecture") or "microarchitecture not listed"
    simd = f", {machine['simd']}" if machine.get("simd") else ""
    return (f"{name} ({machine.get('vendor', '?')} {arch}, family {machine['family']} "
            f"model {machine['model']}{simd})")
