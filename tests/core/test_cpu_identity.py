"""tformer.core.cpu: the vendor, family, model, microarchitecture and vector width that every
result file records, read from /proc/cpuinfo text."""
from tformer.core import cpu, provenance

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse sse2 sse4_2 avx avx2 fma avx512f avx512bw amx_tile

processor\t: 1
vendor_id\t: SomethingElse
"""
AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 sse4_2 avx avx2 fma
"""


def test_an_intel_entry_is_read_from_the_first_processor():
    info = cpu.parse_cpuinfo(INTEL)
    assert info == dict(cpu="Intel(R) Xeon(R) Processor", vendor="Intel", family=6, model=207,
                        microarchitecture="Emerald Rapids", simd="AVX-512")
    assert cpu.label(info) == ("Intel(R) Xeon(R) Processor (Intel Emerald Rapids, family 6 "
                               "model 207, AVX-512)")


def test_an_amd_entry_and_an_unlisted_model():
    info = cpu.parse_cpuinfo(AMD)
    assert (info["vendor"], info["microarchitecture"], info["simd"]) == ("AMD", "Zen 3", "AVX2")
    odd = cpu.parse_cpuinfo(AMD.replace("cpu family\t: 25", "cpu family\t: 99"))
    assert odd["microarchitecture"] is None
    assert "microarchitecture not listed, family 99 model 1" in cpu.label(odd)


def test_missing_fields_are_left_out_and_an_old_record_says_so():
    assert cpu.parse_cpuinfo("processor : 0\nmodel name : X\n") == {"cpu": "X"}
    assert cpu.label({"cpu": "AMD EPYC"}) == "AMD EPYC (family and model not recorded)"
    assert cpu.identify("/nonexistent/cpuinfo").keys() == {"cpu"}


def test_every_result_records_the_cpu_of_this_machine():
    m = provenance.record("bench")["machine"]
    assert m == {**m, **cpu.identify()} and m["cpu"]
