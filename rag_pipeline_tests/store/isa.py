"""Find AVX-512 code in an x86-64 ELF file without running it.

A pgvector build compiled for AVX-512 kills the backend with SIGILL on an older CPU but runs fine
on a CPU that has it: only reading the machine code catches it on every machine.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import capstone
from elftools.common.exceptions import ELFError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

# Legacy and REX prefixes. In 64-bit mode 0x62 is no longer BOUND: as the first byte after these
# it can only start an EVEX prefix, which AVX-512 introduced (this also catches xmm/ymm-only
# AVX-512 instructions such as vcvtsd2usi or vpbroadcastd xmm0, eax).
_PREFIXES = frozenset(b"\xf0\xf2\xf3\x2e\x36\x3e\x26\x64\x65\x66\x67") | frozenset(range(0x40, 0x50))
_EVEX = 0x62
# The registers AVX-512 added: zmm0-31, xmm16-31/ymm16-31, and the opmasks k0-k7 (the
# k-instructions such as kmovw are VEX-encoded, so the EVEX test alone would miss them).
_REGISTERS = re.compile(r"\b(zmm\d+|[xy]mm(?:1[6-9]|2\d|3[01])|k[0-7])\b")
# CPU-dispatched AVX-512 variants, called only after cpuid says the CPU has AVX-512: pgvector
# names them ...Avx512... (BitHammingDistanceAvx512Popcount), PostgreSQL ..._avx512
# (pg_popcount_avx512, pg_comp_crc32c_avx512). No other function may contain AVX-512.
_DISPATCHED = re.compile(r"\w*Avx512\w*|\w+_avx512")
# Every AVX-512 instruction is EVEX-encoded (0x62) or, the k-instructions, VEX-encoded (0xc4, 0xc5):
# an instruction without one of these bytes needs no look (the scan's hot loop: 2.5M instructions).
_MAY_NEED_AVX512 = frozenset(b"\x62\xc4\xc5")
_STT_FUNC = 2   # the symbol type of a function, in the low nibble of st_info


def avx512_reasons(raw: bytes, op_str: str) -> set[str]:
    """Why one instruction (its bytes, capstone's operand text) needs AVX-512; empty if it does not."""
    reasons = set(_REGISTERS.findall(op_str))
    index = 0
    while index < len(raw) and raw[index] in _PREFIXES:
        index += 1
    if index < len(raw) and raw[index] == _EVEX:
        reasons.add("evex")
    return reasons


def is_dispatched(name: str) -> bool:
    """Whether a function's name marks it as a variant picked at run time for AVX-512 CPUs.

    Every alias of the body must be marked. GCC's pieces of a function (name.cold, name.part.0,
    name.constprop.0) count as that function.
    """
    return all(_DISPATCHED.fullmatch(alias.split(".")[0]) for alias in name.split("/"))


@dataclass
class Hits:
    """The AVX-512 instructions of one function (or of code no symbol covers)."""

    count: int = 0
    first: str = ""

    def add(self, address: int, mnemonic: str, op_str: str) -> None:
        self.count += 1
        if not self.first:
            self.first = f"{address:#x}: {mnemonic} {op_str}".rstrip()


def uncovered(start: int, end: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, end) outside every [low, high) range: code no function symbol describes."""
    gaps, cursor = [], start
    for low, high in sorted(ranges):
        if low > cursor:
            gaps.append((cursor, min(low, end)))
        cursor = max(cursor, high)
    if cursor < end:
        gaps.append((cursor, end))
    return [(low, high) for low, high in gaps if low < high]


def elf_machine(path: Path) -> str:
    """The file's ELF architecture, e.g. EM_X86_64; ValueError if it is not ELF at all."""
    with path.open("rb") as handle:
        try:
            return ELFFile(handle)["e_machine"]
        except ELFError as error:
            raise ValueError(f"{path} is not an ELF file ({error}): only ELF builds can be checked") from error


def scan(path: Path) -> dict[str, Hits]:
    """Per function, the instructions of an x86-64 ELF file that need AVX-512.

    Functions are the sized STT_FUNC symbols (.symtab, else .dynsym) in executable sections;
    bytes no symbol covers (padding, stubs, a stripped file's whole .text) are swept linearly
    and reported as "<section> (no symbol)".
    """
    with path.open("rb") as handle:
        elf = ELFFile(handle)
        if elf["e_machine"] != "EM_X86_64":
            raise ValueError(f"{path} is {elf['e_machine']}: the AVX-512 check reads x86-64 code only")
        functions = _functions(elf)
        disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        hits: dict[str, Hits] = {}
        for section in elf.iter_sections():
            if not section["sh_flags"] & SH_FLAGS.SHF_EXECINSTR or section["sh_type"] == "SHT_NOBITS":
                continue
            code, base = section.data(), section["sh_addr"]
            end = base + len(code)
            regions = [(span, name) for span, name in functions.items() if base <= span[0] < end]
            gaps = uncovered(base, end, [span for span, _ in regions])
            regions += [(span, f"{section.name} (no symbol)") for span in gaps]
            for (low, high), name in regions:
                chunk = code[low - base : min(high, end) - base]
                for address, raw, mnemonic, op_str in instructions(disassembler, chunk, low):
                    if _MAY_NEED_AVX512.isdisjoint(raw):   # neither EVEX nor VEX (k-instructions)
                        continue
                    if avx512_reasons(raw, op_str):
                        hits.setdefault(name, Hits()).add(address, mnemonic, op_str)
        return hits


def instructions(disassembler: capstone.Cs, code: bytes, address: int) -> Iterator[tuple[int, bytes, str, str]]:
    """(address, bytes, mnemonic, operands) of every instruction in code.

    A byte capstone cannot decode comes alone as "(bad)" and the sweep goes on after it, so an
    EVEX instruction too new for capstone still shows its 0x62.
    """
    offset = 0
    while offset < len(code):
        for at, size, mnemonic, op_str in disassembler.disasm_lite(code[offset:], address + offset):
            yield at, code[offset : offset + size], mnemonic, op_str
            offset += size
        if offset < len(code):
            yield address + offset, code[offset : offset + 1], "(bad)", ""
            offset += 1


def _functions(elf: ELFFile) -> dict[tuple[int, int], str]:
    """Sized function symbols by [start, end); aliases of one body share a "/"-joined name. The
    table is read with struct (pyelftools' symbol objects took ~4 s for the server's binaries)."""
    table = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
    if table is None:
        return {}
    names = elf.get_section(table["sh_link"]).data()
    spans: dict[tuple[int, int], set[str]] = {}
    # Elf64_Sym: st_name, st_info, st_other, st_shndx, st_value, st_size (little-endian x86-64).
    for name_at, info, _other, _shndx, start, size in struct.iter_unpack("<IBBHQQ", table.data()):
        name = names[name_at : names.index(b"\0", name_at)].decode("utf-8", "replace")
        if info & 0xF == _STT_FUNC and size > 0 and name:
            spans.setdefault((start, start + size), set()).add(name)
    return {span: "/".join(sorted(aliases)) for span, aliases in spans.items()}
