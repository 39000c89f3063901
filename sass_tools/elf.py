"""Reading and in-place patching of NVIDIA cubins (ELF64, ``EM_CUDA``).

Both cubin flavours produced for sm_90a are understood:

* CUDA 12.x ptxas/NVRTC: ``EI_OSABI = 0x33``, ``EI_ABIVERSION = 7``, SM number in the low byte of ``e_flags``.
* CUDA 13.x ptxas/NVRTC: ``EI_OSABI = 0x41``, ``EI_ABIVERSION = 8``, SM number in bits 8-15 of ``e_flags``; the
  "a" (accelerated) feature lives in ``.nv.compat``.

The file is kept as a :class:`bytearray`; parsing never rebuilds it, so :meth:`Cubin.to_bytes` of an unmodified cubin
returns the input bytes exactly, and instruction patches (:meth:`Cubin.set_instruction`, :meth:`Cubin.write_text`)
overwrite bytes in place without moving anything (no offsets, sizes or checksums need fixing: cubins carry none).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

__all__ = [
    "EM_CUDA",
    "Section",
    "Symbol",
    "NvInfoAttr",
    "Kernel",
    "Cubin",
    "EIATTR_NAMES",
    "EICOMPAT_NAMES",
    "parse_nv_info",
]

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_CUDA = 190

# Section types.
SHT_NULL = 0
SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_RELA = 4
SHT_NOTE = 7
SHT_NOBITS = 8
SHT_REL = 9
SHT_CUDA_INFO = 0x70000000
SHT_CUDA_CALLGRAPH = 0x70000001
SHT_CUDA_COMPAT = 0x70000086

SHF_WRITE = 0x1
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4

STT_NOTYPE = 0
STT_OBJECT = 1
STT_FUNC = 2
STT_SECTION = 3
STB_LOCAL = 0
STB_GLOBAL = 1
STB_WEAK = 2
STO_CUDA_ENTRY = 0x10

# .nv.info record formats.
EIFMT_NVAL = 1
EIFMT_BVAL = 2
EIFMT_HVAL = 3
EIFMT_SVAL = 4
EIFMT_NAMES = {EIFMT_NVAL: "NVAL", EIFMT_BVAL: "BVAL", EIFMT_HVAL: "HVAL", EIFMT_SVAL: "SVAL"}

#: ``.nv.info`` attribute codes -> names, as printed by ``cuobjdump -elf`` 13.5 (only codes seen in NVRTC 12.8-13.5
#: sm_90a cubins and checked by the tests; others print as ``EIATTR_UNKNOWN_0xNN``).
EIATTR_NAMES: Dict[int, str] = {
    0x05: "EIATTR_MAX_THREADS",
    0x0A: "EIATTR_PARAM_CBANK",
    0x11: "EIATTR_FRAME_SIZE",
    0x12: "EIATTR_MIN_STACK_SIZE",
    0x17: "EIATTR_KPARAM_INFO",
    0x19: "EIATTR_CBANK_PARAM_SIZE",
    0x1B: "EIATTR_MAXREG_COUNT",
    0x1C: "EIATTR_EXIT_INSTR_OFFSETS",
    0x1E: "EIATTR_CRS_STACK_SIZE",
    0x28: "EIATTR_COOP_GROUP_INSTR_OFFSETS",
    0x2F: "EIATTR_REGCOUNT",
    0x31: "EIATTR_INT_WARP_WIDE_INSTR_OFFSETS",
    0x36: "EIATTR_SW_WAR",
    0x37: "EIATTR_CUDA_API_VERSION",
    0x38: "EIATTR_NUM_MBARRIERS",
    0x39: "EIATTR_MBARRIER_INSTR_OFFSETS",
    0x3D: "EIATTR_CTA_PER_CLUSTER",
    0x3E: "EIATTR_EXPLICIT_CLUSTER",
    0x4C: "EIATTR_NUM_BARRIERS",
    0x50: "EIATTR_SPARSE_MMA_MASK",
    0x54: "EIATTR_REG_RECONFIG",
    0x66: "EIATTR_LANGUAGE",
    0x6B: "EIATTR_NVSAL_SW_WAR",
    0x6D: "EIATTR_PREEXIT_USED",
}

#: ``.nv.compat`` attribute codes (CUDA 13 cubins) -> names, as printed by ``cuobjdump -elf``.
EICOMPAT_NAMES: Dict[int, str] = {
    0x02: "EICOMPAT_ATTR_ISA_CLASS",
    0x03: "EICOMPAT_ATTR_INST_TENSORMAP_V1",
    0x09: "EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET",
    0x0B: "EICOMPAT_ATTR_CAN_FASTPATH_FINALIZE",
    0x0C: "EICOMPAT_ATTR_CUDA_INTERNAL_TARGET",
    0x0E: "EICOMPAT_ATTR_FINALIZER_VERSION",
}

EIATTR = {name[len("EIATTR_"):]: code for code, name in EIATTR_NAMES.items()}
"""Reverse map, e.g. ``EIATTR["REGCOUNT"] == 0x2f``."""

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # 64 bytes
_SHDR = struct.Struct("<IIQQQQIIQQ")  # 64 bytes
_SYM = struct.Struct("<IBBHQQ")  # 24 bytes


@dataclass
class Section:
    """One ELF section header (plus its name). ``data`` is read from the owning cubin on demand."""

    index: int
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int

    @property
    def has_file_data(self) -> bool:
        """False for NOBITS (e.g. ``.nv.shared.K``) and NULL sections, which occupy no file bytes."""
        return self.type not in (SHT_NOBITS, SHT_NULL)


@dataclass
class Symbol:
    """One ``.symtab`` entry."""

    index: int
    name: str
    value: int
    size: int
    info: int
    other: int
    shndx: int

    @property
    def bind(self) -> int:
        return self.info >> 4

    @property
    def type(self) -> int:
        return self.info & 0xF

    @property
    def is_entry(self) -> bool:
        """True for CUDA kernels (``STT_FUNC`` with ``STO_CUDA_ENTRY`` in ``st_other``)."""
        return self.type == STT_FUNC and bool(self.other & STO_CUDA_ENTRY)


@dataclass
class NvInfoAttr:
    """One record of a ``.nv.info`` / ``.nv.info.K`` / ``.nv.compat`` section.

    Layout: ``u8 format, u8 attribute, u16 value-or-size`` followed, for ``EIFMT_SVAL`` only, by ``size`` payload bytes.
    ``value`` is the inline 16-bit field (the byte value for BVAL, the u16 for HVAL, the payload size for SVAL).
    ``offset`` is the file offset of the record header.
    """

    format: int
    attr: int
    value: int
    payload: bytes
    offset: int
    names: Dict[int, str] = field(default_factory=lambda: EIATTR_NAMES, repr=False, compare=False)

    @property
    def name(self) -> str:
        prefix = "EICOMPAT_ATTR" if self.names is EICOMPAT_NAMES else "EIATTR"
        return self.names.get(self.attr, f"{prefix}_UNKNOWN_0x{self.attr:02x}")

    @property
    def format_name(self) -> str:
        return EIFMT_NAMES.get(self.format, f"FMT{self.format}")

    def u32s(self) -> List[int]:
        """The SVAL payload as little-endian u32 words (trailing bytes that do not fill a word are dropped)."""
        n = len(self.payload) // 4
        return list(struct.unpack_from(f"<{n}I", self.payload)) if n else []


def parse_nv_info(data: bytes, base_offset: int = 0, names: Optional[Dict[int, str]] = None) -> List[NvInfoAttr]:
    """Parse a ``.nv.info``-style record stream.

    Raises ValueError if a record runs past the end of the data (the section is malformed).
    """
    table = EIATTR_NAMES if names is None else names
    out: List[NvInfoAttr] = []
    pos = 0
    n = len(data)
    while pos + 4 <= n:
        fmt, attr, val = struct.unpack_from("<BBH", data, pos)
        if fmt == EIFMT_SVAL:
            end = pos + 4 + val
            if end > n:
                raise ValueError(
                    f"nv.info record at +0x{pos:x} (attr 0x{attr:02x}) claims {val} payload bytes, "
                    f"only {n - pos - 4} left"
                )
            payload = bytes(data[pos + 4 : end])
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            end = pos + 4
            payload = b""
        else:
            raise ValueError(f"nv.info record at +0x{pos:x} has unknown format {fmt}")
        out.append(NvInfoAttr(fmt, attr, val, payload, base_offset + pos, table))
        pos = end
    if pos != n:
        raise ValueError(f"nv.info section has {n - pos} trailing bytes that do not form a record")
    return out


@dataclass
class Kernel:
    """A kernel (``STO_CUDA_ENTRY`` function) of a cubin with the facts the JIT and the SASS pass need.

    ``text_offset`` is the file offset of ``.text.<name>``: the instruction at SASS address A lies at
    ``text_offset + A``. ``text`` is a snapshot taken when the kernel object was built; use
    :meth:`Cubin.read_text` for the current bytes after patching.
    """

    name: str
    symbol_index: int
    text_section: int
    text_offset: int
    text_size: int
    code_size: int
    text: bytes
    registers: Optional[int]
    shared_bytes: int
    max_threads: Optional[Tuple[int, int, int]]
    max_reg_count: Optional[int]
    param_size: Optional[int]
    num_barriers: Optional[int]
    num_mbarriers: Optional[int]
    frame_size: Optional[int]
    min_stack_size: Optional[int]
    reg_reconfig: bool
    exit_offsets: List[int]
    cuda_api_version: Optional[int]
    attributes: List[NvInfoAttr]

    @property
    def num_instructions(self) -> int:
        """Number of 16-byte instruction slots in ``.text.<name>`` (padding NOPs included)."""
        return self.text_size // 16

    def attribute(self, name_or_code) -> Optional[NvInfoAttr]:
        """First per-kernel ``.nv.info.K`` record with that attribute name (``"MAX_THREADS"`` or full) or code."""
        for a in self.attributes:
            if a.attr == name_or_code or a.name == name_or_code or a.name == f"EIATTR_{name_or_code}":
                return a
        return None


class Cubin:
    """A parsed cubin. Construct with :meth:`from_bytes`; serialize with :meth:`to_bytes`."""

    def __init__(self, data: bytes) -> None:
        self._data = bytearray(data)
        self._parse()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_bytes(cls, data: bytes) -> "Cubin":
        """Parse ``data``; raises ValueError if it is not a 64-bit little-endian EM_CUDA ELF or is truncated."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"expected bytes, got {type(data).__name__}")
        return cls(bytes(data))

    @classmethod
    def from_file(cls, path) -> "Cubin":
        with open(path, "rb") as f:
            return cls.from_bytes(f.read())

    def to_bytes(self) -> bytes:
        """The cubin's bytes, including any in-place instruction patches (identical to the input when unpatched)."""
        return bytes(self._data)

    def _parse(self) -> None:
        d = self._data
        if len(d) < 4 or bytes(d[:4]) != ELF_MAGIC:
            raise ValueError("not a cubin: bad ELF magic (expected 7f 45 4c 46)")
        if len(d) < _EHDR.size:
            raise ValueError(f"truncated cubin: {len(d)} bytes, smaller than the 64-byte ELF64 header")
        (ident, e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize, e_phentsize, e_phnum,
         e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(d, 0)
        if ident[4] != ELFCLASS64:
            raise ValueError(f"not a cubin: ELF class {ident[4]} (only ELFCLASS64 cubins are supported)")
        if ident[5] != ELFDATA2LSB:
            raise ValueError("not a cubin: big-endian ELF")
        if e_machine != EM_CUDA:
            raise ValueError(f"not a cubin: e_machine = {e_machine}, expected {EM_CUDA} (EM_CUDA)")
        self.ident = bytes(ident)
        self.osabi = ident[7]
        self.abi_version = ident[8]
        self.e_type = e_type
        self.e_machine = e_machine
        self.e_version = e_version
        self.e_flags = e_flags
        self.e_phoff = e_phoff
        self.e_phnum = e_phnum
        self.e_phentsize = e_phentsize
        self.e_shoff = e_shoff
        self.e_shnum = e_shnum
        self.e_shentsize = e_shentsize
        self.e_shstrndx = e_shstrndx
        if e_shnum == 0:
            raise ValueError("cubin has no section headers")
        if e_shentsize != _SHDR.size:
            raise ValueError(f"unexpected section header size {e_shentsize} (expected {_SHDR.size})")
        sh_end = e_shoff + e_shnum * e_shentsize
        if sh_end > len(d):
            raise ValueError(
                f"truncated cubin: section header table ends at {sh_end} but the file has {len(d)} bytes"
            )
        if e_phnum:
            ph_end = e_phoff + e_phnum * e_phentsize
            if ph_end > len(d):
                raise ValueError(
                    f"truncated cubin: program headers end at {ph_end} but the file has {len(d)} bytes "
                    "(CuPy's nvrtc.getCUBIN drops the last byte: append b'\\x00')"
                )
        raw = [_SHDR.unpack_from(d, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        for i, r in enumerate(raw):
            s_type, s_off, s_size = r[1], r[4], r[5]
            if s_type not in (SHT_NOBITS, SHT_NULL) and s_off + s_size > len(d):
                raise ValueError(
                    f"truncated cubin: section {i} occupies [{s_off}, {s_off + s_size}) past the end of the "
                    f"{len(d)}-byte file"
                )
        if e_shstrndx >= e_shnum:
            raise ValueError(f"bad e_shstrndx {e_shstrndx} (only {e_shnum} sections)")
        shstr = raw[e_shstrndx]
        shstrtab = bytes(d[shstr[4] : shstr[4] + shstr[5]])
        self.sections: List[Section] = []
        for i, (nm, ty, fl, ad, off, sz, lk, inf, al, es) in enumerate(raw):
            self.sections.append(Section(i, _cstr(shstrtab, nm), ty, fl, ad, off, sz, lk, inf, al, es))
        self._by_name = {s.name: s for s in self.sections}

        # Symbols.
        self.symbols: List[Symbol] = []
        symtab = next((s for s in self.sections if s.type == SHT_SYMTAB), None)
        if symtab is not None:
            if symtab.entsize and symtab.entsize != _SYM.size:
                raise ValueError(f"unexpected symbol entry size {symtab.entsize}")
            if symtab.link >= len(self.sections):
                raise ValueError("symbol table links to a missing string table")
            strtab = self.section_data(self.sections[symtab.link])
            for i in range(symtab.size // _SYM.size):
                nm, info, other, shndx, value, size = _SYM.unpack_from(d, symtab.offset + i * _SYM.size)
                self.symbols.append(Symbol(i, _cstr(strtab, nm), value, size, info, other, shndx))

        # Global .nv.info (REGCOUNT, FRAME_SIZE, MIN_STACK_SIZE per symbol index).
        self.global_info: List[NvInfoAttr] = []
        gi = self._by_name.get(".nv.info")
        if gi is not None:
            self.global_info = parse_nv_info(self.section_data(gi), gi.offset)
        self.compat_info: List[NvInfoAttr] = []
        ci = next((s for s in self.sections if s.type == SHT_CUDA_COMPAT), None)
        if ci is not None:
            self.compat_info = parse_nv_info(self.section_data(ci), ci.offset, EICOMPAT_NAMES)

        self.kernels: List[Kernel] = [self._build_kernel(sym) for sym in self.symbols if sym.is_entry]

    def _per_symbol(self, attr_code: int) -> Dict[int, int]:
        out: Dict[int, int] = {}
        for a in self.global_info:
            if a.attr == attr_code and a.format == EIFMT_SVAL and len(a.payload) >= 8:
                sym, val = struct.unpack_from("<II", a.payload)
                out[sym] = val
        return out

    def _build_kernel(self, sym: Symbol) -> Kernel:
        if sym.shndx >= len(self.sections):
            raise ValueError(f"kernel symbol {sym.name!r} points at missing section {sym.shndx}")
        text = self.sections[sym.shndx]
        info_sec = self._by_name.get(f".nv.info.{sym.name}")
        attrs = parse_nv_info(self.section_data(info_sec), info_sec.offset) if info_sec is not None else []
        shared = self._by_name.get(f".nv.shared.{sym.name}")

        def first(code: int) -> Optional[NvInfoAttr]:
            return next((a for a in attrs if a.attr == code), None)

        max_threads = None
        a = first(EIATTR["MAX_THREADS"])
        if a is not None and len(a.payload) >= 12:
            max_threads = tuple(struct.unpack_from("<III", a.payload))
        max_reg = first(EIATTR["MAXREG_COUNT"])
        psize = first(EIATTR["CBANK_PARAM_SIZE"])
        nbar_attr = first(EIATTR["NUM_BARRIERS"])
        if nbar_attr is not None:
            nbar: Optional[int] = nbar_attr.value
        elif self.abi_version <= 7:
            nbar = (text.flags >> 20) & 0x7F  # CUDA 12: named-barrier count in sh_flags bits 20+
        else:
            nbar = 0
        nmbar = first(EIATTR["NUM_MBARRIERS"])
        exits_attr = first(EIATTR["EXIT_INSTR_OFFSETS"])
        api = first(EIATTR["CUDA_API_VERSION"])
        regs = self._per_symbol(EIATTR["REGCOUNT"]).get(sym.index)
        frame = self._per_symbol(EIATTR["FRAME_SIZE"]).get(sym.index)
        stack = self._per_symbol(EIATTR["MIN_STACK_SIZE"]).get(sym.index)
        return Kernel(
            name=sym.name,
            symbol_index=sym.index,
            text_section=text.index,
            text_offset=text.offset,
            text_size=text.size,
            code_size=sym.size,
            text=self.section_data(text),
            registers=regs,
            shared_bytes=shared.size if shared is not None else 0,
            max_threads=max_threads,  # type: ignore[arg-type]
            max_reg_count=max_reg.value if max_reg is not None else None,
            param_size=psize.value if psize is not None else None,
            num_barriers=nbar,
            num_mbarriers=nmbar.value if nmbar is not None else None,
            frame_size=frame,
            min_stack_size=stack,
            reg_reconfig=first(EIATTR["REG_RECONFIG"]) is not None,
            exit_offsets=exits_attr.u32s() if exits_attr is not None else [],
            cuda_api_version=api.u32s()[0] if api is not None and api.u32s() else None,
            attributes=attrs,
        )

    # ------------------------------------------------------------------ header facts
    @property
    def sm(self) -> int:
        """SM number (90 for sm_90/sm_90a), from ``e_flags`` (low byte for ABI 7, bits 8-15 for ABI 8)."""
        if self.abi_version >= 8:
            return (self.e_flags >> 8) & 0xFF
        return self.e_flags & 0xFF

    @property
    def is_arch_specific(self) -> bool:
        """True for "a" targets (sm_90a): e_flags bit 0x800 (ABI 7) or .nv.compat CUDA_ACCELERATOR_TARGET = 1 (ABI 8)."""
        if self.abi_version >= 8:
            return any(a.attr == 0x09 and a.value & 0xFF for a in self.compat_info)
        return bool(self.e_flags & 0x800)

    @property
    def arch(self) -> str:
        """``"sm_90a"`` style target name."""
        return f"sm_{self.sm}{'a' if self.is_arch_specific else ''}"

    @property
    def toolkit_version(self) -> Optional[Tuple[int, int]]:
        """(major, minor) of the producing toolkit, encoded as decimal ``10 * major + minor``: ``e_version`` for ABI 7
        (0x80 = 128 -> 12.8), the ``.note.nv.cuinfo`` descriptor for ABI 8 (0x87 -> 13.5)."""
        if self.abi_version <= 7 and self.e_version > 1:
            return (self.e_version // 10, self.e_version % 10)  # 0x80 = 128 -> 12.8, 0x81 -> 12.9
        note = self._by_name.get(".note.nv.cuinfo")
        if note is not None:
            nd = self.section_data(note)
            if len(nd) >= 12:
                namesz, descsz, _ = struct.unpack_from("<III", nd)
                desc_off = 12 + ((namesz + 3) & ~3)
                if descsz >= 8 and desc_off + 8 <= len(nd):
                    _ver, _vsm, tk = struct.unpack_from("<HHI", nd, desc_off)
                    return (tk // 10, tk % 10)
        return None

    # ------------------------------------------------------------------ access helpers
    def section(self, name: str) -> Section:
        """Section by name; KeyError if absent."""
        return self._by_name[name]

    def has_section(self, name: str) -> bool:
        return name in self._by_name

    def section_data(self, sec: Section) -> bytes:
        """Current file bytes of a section (``b""`` for NOBITS)."""
        if not sec.has_file_data:
            return b""
        return bytes(self._data[sec.offset : sec.offset + sec.size])

    def kernel(self, name: str) -> Kernel:
        """Kernel by (mangled) name; KeyError listing the available names if absent."""
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(f"no kernel {name!r} in cubin (kernels: {[k.name for k in self.kernels]})")

    def _kernel(self, kernel) -> Kernel:
        return kernel if isinstance(kernel, Kernel) else self.kernel(kernel)

    def read_text(self, kernel) -> bytes:
        """Current bytes of the kernel's ``.text`` section (reflects patches)."""
        k = self._kernel(kernel)
        return bytes(self._data[k.text_offset : k.text_offset + k.text_size])

    def write_text(self, kernel, text: bytes) -> None:
        """Overwrite the kernel's ``.text`` in place; the size must not change."""
        k = self._kernel(kernel)
        if len(text) != k.text_size:
            raise ValueError(f"new .text for {k.name!r} has {len(text)} bytes, expected {k.text_size}")
        self._data[k.text_offset : k.text_offset + k.text_size] = text

    def instructions(self, kernel) -> List[Tuple[int, int]]:
        """The kernel's current ``.text`` as (lo, hi) u64 pairs, one per 128-bit instruction."""
        return split_words(self.read_text(kernel))

    def set_instruction(self, kernel, index: int, lo: int, hi: int) -> None:
        """Overwrite instruction ``index`` (SASS address ``16 * index``) of ``kernel`` in place."""
        k = self._kernel(kernel)
        if not 0 <= index < k.text_size // 16:
            raise IndexError(f"instruction index {index} out of range for {k.name!r} ({k.text_size // 16} slots)")
        struct.pack_into("<QQ", self._data, k.text_offset + 16 * index, lo, hi)

    def iter_kernel_instructions(self) -> Iterator[Tuple[Kernel, int, int, int]]:
        """Yield (kernel, index, lo, hi) over all kernels."""
        for k in self.kernels:
            for i, (lo, hi) in enumerate(self.instructions(k)):
                yield k, i, lo, hi

    def __repr__(self) -> str:
        return (f"<Cubin {self.arch} ABI {self.abi_version} {len(self._data)} bytes, "
                f"kernels={[k.name for k in self.kernels]}>")


def split_words(text: bytes) -> List[Tuple[int, int]]:
    """Split instruction bytes into (lo, hi) little-endian u64 pairs; the length must be a multiple of 16."""
    if len(text) % 16:
        raise ValueError(f".text length {len(text)} is not a multiple of 16 bytes")
    n = len(text) // 16
    words = struct.unpack(f"<{2 * n}Q", text) if n else ()
    return [(words[2 * i], words[2 * i + 1]) for i in range(n)]


def join_words(words: Sequence[Tuple[int, int]]) -> bytes:
    """Inverse of :func:`split_words`."""
    flat = [w for pair in words for w in pair]
    return struct.pack(f"<{len(flat)}Q", *flat)


def _cstr(table: bytes, off: int) -> str:
    if off >= len(table):
        return ""
    end = table.find(b"\x00", off)
    if end < 0:
        end = len(table)
    return table[off:end].decode("utf-8", "replace")
