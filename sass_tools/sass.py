"""sm_90a SASS instruction words: split, decode, edit, re-encode.

An instruction is 128 bits stored as two little-endian u64 words, ``lo`` (bytes 0-7) and ``hi`` (bytes 8-15).
Fields handled here (bit numbers of ``hi`` unless noted):

=========  ==========================================================================================
lo 0-11    opcode incl. operand-form selector (bits 9-11)
lo 12-15   guard predicate: index 0-7 (7 = PT, or UPT for uniform-datapath ops), bit 15 = negate
41-44      stall cycles (0-15)
45         yield, **inverted**: 0 = yield, 1 = no yield
46-48      write scoreboard (7 = none)
49-51      read scoreboard (7 = none)
52-57      wait mask (bit k = wait on scoreboard k)
58-61      operand reuse flags (58 = a slot, 59 = b slot, 60 = c slot, 61 = fourth slot)
=========  ==========================================================================================

FFMA/FADD/FMUL operands are decoded too (registers, immediates, constants, uniform registers, neg/abs modifiers,
``.reuse``); every other opcode keeps its operand bits untouched. :meth:`Instruction.encode` starts from the original
words and writes back only the decoded fields, so ``decode(lo, hi).encode() == (lo, hi)`` for every word, known
opcode or not.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

from .elf import join_words, split_words

__all__ = [
    "OpInfo",
    "OPCODES",
    "FFMA_FORMS",
    "FADD_FORMS",
    "FMUL_FORMS",
    "Operand",
    "Instruction",
    "decode",
    "decode_text",
    "encode_text",
    "split_words",
    "join_words",
    "is_ffma",
    "parse_control_text",
    "format_control",
]

MASK64 = (1 << 64) - 1

# ---- control / predicate bit positions (in hi unless noted) ----
STALL_SHIFT, STALL_MASK = 41, 0xF
YIELD_BIT = 45  # 1 = no yield (inverted)
WBAR_SHIFT, RBAR_SHIFT, BAR_MASK = 46, 49, 0x7
WAIT_SHIFT, WAIT_MASK = 52, 0x3F
REUSE_SHIFT, REUSE_MASK = 58, 0xF
CONTROL_MASK_HI = ((1 << 21) - 1) << 41  # bits 41-61: stall, yield, barriers, wait, reuse
YIELD_MASK_HI = 1 << YIELD_BIT
REUSE_MASK_HI = REUSE_MASK << REUSE_SHIFT
PRED_SHIFT = 12  # lo

REUSE_A, REUSE_B, REUSE_C, REUSE_D = 1, 2, 4, 8  # bits of the 4-bit reuse field


class OpInfo(NamedTuple):
    """What we know about one 12-bit opcode: mnemonic (or mnemonic family), class, guard predicate kind."""

    name: str
    klass: str
    uniform_guard: bool = False
    form: Optional[str] = None


# Uniform-datapath ops whose guard predicate prints as UPn (checked with nvdisasm 13.5 on real and probe words).
_UNIFORM_GUARD: FrozenSet[int] = frozenset(
    {0x290, 0x291, 0x3B4, 0x3B5, 0x3BA, 0x5B2, 0x5B4, 0x882, 0x890, 0x899, 0x89C, 0x8A5, 0x9B7, 0x9B9,
     0x9C3, 0x9C7, 0x9C8, 0xAB9, 0xC82, 0xDC7, 0x287, 0x887, 0x88C, 0x892, 0x8A4,
     0x28C, 0x292, 0x2A4, 0x2A5, 0x4A4, 0x891, 0x897}
)

FFMA_FORMS: Dict[int, str] = {
    0x223: "R,R,R", 0x423: "R,R,imm", 0x623: "R,R,c[]", 0x823: "R,imm,R",
    0xA23: "R,c[],R", 0xC23: "R,UR,R", 0xE23: "R,R,UR",
}
FADD_FORMS: Dict[int, str] = {0x221: "R,R", 0x421: "R,imm", 0x621: "R,c[]", 0xE21: "R,UR"}
FMUL_FORMS: Dict[int, str] = {0x220: "R,R", 0x820: "R,imm", 0xA20: "R,c[]", 0xC20: "R,UR"}

# name -> class for the opcode table below.
_CLASS_OF: Dict[str, str] = {}
for _k, _names in {
    "fp32": "FFMA FADD FMUL FMNMX FSEL FSET FSETP FCHK FRND FSWZADD MUFU",
    "fp16": "HADD2 HFMA2 HMUL2 HMNMX2 HSET2 HSETP2 VHMNMX",
    "fp64": "DADD DFMA DMUL DSETP",
    "int": ("IMAD IADD3 IABS IDP IMNMX ISETP LEA LOP3 PLOP3 SHF SGXT BMSK BREV FLO POPC PRMT VIADD VIADDMNMX "
            "VIMNMX VIMNMX3 VABSDIFF VABSDIFF4 CLMAD"),
    "conv": "F2FP F2IP I2F I2FP I2I I2IP",
    "move": "MOV SEL P2R R2P S2R CS2R S2UR R2UR SHFL VOTE MATCH REDUX",
    "uniform": "UMOV UIADD3 UIMAD ULEA USHF UPLOP3 ULDC VOTEU",
    "memory": ("LD LDG LDS LDL LDC LDSM ST STG STS STL STSM ATOM ATOMG ATOMS REDG CCTL CCTLL QSPC LDGDEPBAR "
               "ACQBULK"),
    "mma": "HGMMA IGMMA BGMMA QGMMA WARPGROUP HMMA IMMA BMMA DMMA",
    "tma": "UTMALDG UTMASTG UTMACCTL UTMACMDFLUSH UBLKCP",
    "sync": ("SYNCS.ARRIVE SYNCS.PHASECHK SYNCS.EXCH SYNCS.CCTL BAR MEMBAR FENCE ERRBAR CGAERRBAR DEPBAR "
             "UCGABAR_ARV UCGABAR_WAIT WARPSYNC ELECT NANOSLEEP ENDCOLLECTIVE USETMAXREG"),
    "control": "BRA BRX JMP JMX CALL RET EXIT BSSY BSYNC BREAK YIELD NOP PREEXIT LEPC",
}.items():
    for _n in _names.split():
        _CLASS_OF[_n] = _k

# 12-bit opcode -> mnemonic. Every entry was checked with nvdisasm 13.5: against real NVRTC 12.8-13.5 sm_90a code
# where the opcode occurs there, otherwise on a probe word (opcode, all other operand bits 0). The HGMMA/IGMMA/BGMMA
# and QGMMA-A-from-registers entries come from small test kernels (tests/sass_helpers.py).
_NAMES: Dict[str, Sequence[int]] = {
    "ACQBULK": [0x82E], "ATOM": [0x38A, 0x38B, 0x3A2], "ATOMG": [0x3A3, 0x3A8, 0x3A9], "ATOMS": [0x38C, 0x38D],
    "BAR": [0x31D, 0x51D, 0x91D, 0xB1D], "BMMA": [0x23D], "BMSK": [0x21B, 0x81B, 0xA1B], "BRA": [0x947],
    "BREAK": [0x942], "BREV": [0x301, 0x901, 0xB01], "BRX": [0x949], "BSSY": [0x945], "BSYNC": [0x941],
    "CALL": [0x343, 0x344, 0x943, 0x944, 0xB43], "CCTL": [0x98F], "CCTLL": [0x990], "CGAERRBAR": [0x5AB],
    "CLMAD": [0x22C, 0x62C, 0xA2C], "CS2R": [0x805], "DADD": [0x229, 0x429, 0x629], "DEPBAR": [0x91A],
    "DFMA": [0x22B, 0x42B, 0x62B, 0x82B, 0xA2B], "DMMA": [0x23F], "DMUL": [0x228, 0x828, 0xA28],
    "DSETP": [0x22A, 0x42A, 0x62A], "ELECT": [0x82F], "ENDCOLLECTIVE": [0x91B], "ERRBAR": [0x9AB],
    "EXIT": [0x94D], "F2FP": [0x23E, 0x83E, 0xA3E], "F2I": [0x305], "F2IP": [0x243, 0x443, 0x643, 0x843, 0xA43],
    "FADD": list(FADD_FORMS), "FCHK": [0x302, 0x902, 0xB02], "FENCE": [0x3C6], "FFMA": list(FFMA_FORMS),
    "FLO": [0x300, 0x900, 0xB00], "FMNMX": [0x209, 0x809, 0xA09], "FMUL": list(FMUL_FORMS),
    "FRND": [0x313, 0x913, 0xB13], "FSEL": [0x208, 0x808, 0xA08], "FSET": [0x20A, 0x80A, 0xA0A],
    "FSETP": [0x20B, 0x80B, 0xA0B], "FSWZADD": [0x822], "HADD2": [0x230, 0x430, 0x630],
    "HFMA2": [0x231, 0x235, 0x431, 0x435, 0x631, 0x635, 0x831, 0x835, 0xA31, 0xA35], "HMMA": [0x23C],
    "HMNMX2": [0x240, 0x840, 0xA40], "HMUL2": [0x232, 0x832, 0xA32], "HSET2": [0x233, 0x433, 0x633],
    "HSETP2": [0x234, 0x434, 0x634], "I2F": [0x306, 0xB06, 0xD06], "I2FP": [0x245, 0xA45], "I2I": [0x238, 0x838, 0xA38],
    "I2IP": [0x239, 0x839, 0xA39], "IABS": [0x213, 0x813, 0xA13], "IADD3": [0x210, 0x810, 0xA10, 0xC10],
    "IDP": [0x226, 0xA26],
    "IMAD": [0x224, 0x225, 0x227, 0x424, 0x624, 0x625, 0x627, 0x824, 0x825, 0x827, 0xA24, 0xA25, 0xA27, 0xC24,
             0xC25, 0xE24],
    "IMMA": [0x237], "IMNMX": [0x217, 0x817, 0xA17], "ISETP": [0x20C, 0x80C, 0xA0C, 0xC0C],
    "JMP": [0x94A, 0xB4A], "JMX": [0x94C], "LD": [0x980], "LDC": [0xB82], "LDG": [0x381, 0x981],
    "LDGDEPBAR": [0x9AF], "LDL": [0x983], "LDS": [0x984], "LDSM": [0x83B], "LEA": [0x211, 0x411, 0x811, 0xA11, 0xC11],
    "LEPC": [0x34E, 0x94E], "LOP3": [0x212, 0x812, 0xA12, 0xC12], "MATCH": [0x3A1], "MEMBAR": [0x992],
    "MOV": [0x202, 0x802, 0xA02, 0xC02], "MUFU": [0x308, 0x908, 0xB08], "NANOSLEEP": [0x35D, 0x95D, 0xB5D],
    "NOP": [0x918], "P2R": [0x203, 0x803, 0xA03], "PLOP3": [0x21D, 0x21E, 0x21F, 0x81C, 0xA1D, 0xA1E, 0xA1F],
    "POPC": [0x309, 0x909, 0xB09], "PREEXIT": [0x82D], "PRMT": [0x216, 0x416, 0x616, 0x816, 0xA16],
    "QSPC": [0x3AA], "R2P": [0x204, 0x804, 0xA04], "R2UR": [0x2CA], "REDG": [0x98E, 0x9A6], "REDUX": [0x3C4],
    "RET": [0x950], "S2R": [0x919], "S2UR": [0x9C3], "SEL": [0x207, 0x807, 0xA07], "SGXT": [0x21A, 0x81A, 0xA1A],
    "SHF": [0x219, 0x419, 0x619, 0x819, 0xA19], "SHFL": [0x389, 0x589, 0x989, 0xF89], "ST": [0x385],
    "STG": [0x386, 0x986], "STL": [0x387], "STS": [0x388, 0x988], "STSM": [0x844],
    "SYNCS.ARRIVE": [0x9A7], "SYNCS.PHASECHK": [0x5A7], "SYNCS.EXCH": [0x5B2], "SYNCS.CCTL": [0x9B1],
    "UBLKCP": [0x3BA], "UCGABAR_ARV": [0x9C7], "UCGABAR_WAIT": [0xDC7], "UIADD3": [0x290, 0x890, 0x897],
    "UIMAD": [0x2A4, 0x2A5, 0x4A4, 0x8A4, 0x8A5], "ULDC": [0xAB9], "ULEA": [0x291, 0x891], "UMOV": [0x882, 0xC82],
    "UPLOP3": [0x89C], "USEL": [0x287, 0x887], "UISETP": [0x28C, 0x88C], "ULOP3": [0x292, 0x892],
    "USETMAXREG": [0x9C8], "USHF": [0x899], "UTMACCTL": [0x9B9], "UTMACMDFLUSH": [0x9B7],
    "UTMALDG": [0x3B4, 0x5B4], "UTMASTG": [0x3B5], "VABSDIFF": [0x214, 0x414, 0x614, 0x814, 0xA14],
    "VABSDIFF4": [0x215, 0x415, 0x615, 0x815, 0xA15], "VHMNMX": [0x247, 0x847, 0xA47],
    "VIADD": [0x236, 0x836, 0xA36, 0xC36], "VIADDMNMX": [0x246, 0x446, 0x646, 0x846, 0xA46],
    "VIMNMX": [0x248, 0x848, 0xA48, 0xC48], "VIMNMX3": [0x20F, 0x80F, 0xA0F], "VOTE": [0x806], "VOTEU": [0x886],
    "WARPGROUP": [0x9C5], "WARPSYNC": [0x348, 0x948], "YIELD": [0x946],
    "HGMMA": [0x9F0], "IGMMA": [0x9F1], "BGMMA": [0x9F2], "QGMMA": [0x9F3, 0xDF3],
}

_FORMS: Dict[int, str] = {**FFMA_FORMS, **FADD_FORMS, **FMUL_FORMS, 0xDF3: "A from registers", 0x9F3: "A from smem"}

#: 12-bit opcode -> :class:`OpInfo`.
OPCODES: Dict[int, OpInfo] = {}
for _name, _codes in _NAMES.items():
    for _c in _codes:
        if _c in OPCODES:
            raise AssertionError(f"duplicate opcode 0x{_c:03x}")
        OPCODES[_c] = OpInfo(_name, _CLASS_OF.get(_name, "other"), _c in _UNIFORM_GUARD, _FORMS.get(_c))
del _name, _codes, _c, _k, _names, _n


def is_ffma(lo: int) -> bool:
    """True if the word is an FFMA in any operand form (0x223/0x423/.../0xe23)."""
    return (lo & 0xFFF) in FFMA_FORMS


def format_control(stall: int, yield_: bool, wbar: int, rbar: int, wait: int) -> str:
    """CuAssembler-style control text ``B<wait>:R<rbar>:W<wbar>:<Y|->:S<stall>``, e.g. ``B--2---:R-:W1:Y:S04``.

    The wait mask shows digit k where bit k is set; barriers print ``-`` for 7 (none); ``Y`` means the yield bit
    is 0 (yield active).
    """
    w = "".join(str(k) if wait >> k & 1 else "-" for k in range(6))
    r = "-" if rbar == 7 else str(rbar)
    wb = "-" if wbar == 7 else str(wbar)
    return f"B{w}:R{r}:W{wb}:{'Y' if yield_ else '-'}:S{stall:02d}"


_CTRL_RE = re.compile(r"^B([-0-5]{6}):R([-0-7]):W([-0-7]):([Y-]):S(\d{1,2})$")


def parse_control_text(text: str) -> Tuple[int, bool, int, int, int]:
    """Inverse of :func:`format_control`: returns (stall, yield_, wbar, rbar, wait). ValueError on bad text."""
    m = _CTRL_RE.match(text.strip())
    if not m:
        raise ValueError(f"bad control text {text!r} (expected e.g. 'B--2---:R-:W1:Y:S04')")
    wtxt, r, w, y, s = m.groups()
    wait = 0
    for k, ch in enumerate(wtxt):
        if ch != "-":
            if ch != str(k):
                raise ValueError(f"bad wait mask {wtxt!r} in {text!r}: position {k} must be '-' or '{k}'")
            wait |= 1 << k
    stall = int(s)
    if stall > 15:
        raise ValueError(f"stall {stall} out of range 0-15 in {text!r}")
    return stall, y == "Y", 7 if w == "-" else int(w), 7 if r == "-" else int(r), wait


def _fmt_float(bits: int) -> str:
    """FP32 immediate text close to nvdisasm's (``%.20g``-style, ``+INF``/``-INF``/``+QNAN``...)."""
    f = struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
    sign = "-" if bits >> 31 & 1 else "+"
    if math.isinf(f):
        return f"{sign}INF"
    if math.isnan(f):
        return f"{sign}{'QNAN' if bits >> 22 & 1 else 'SNAN'}"
    if f == 0.0:
        return "-0.0" if bits >> 31 else "0"
    if f == int(f) and abs(f) < 1e16:
        return str(int(f))
    return f"{f:.20g}"


def _reg(n: int) -> str:
    return "RZ" if n == 255 else f"R{n}"


def _ureg(n: int) -> str:
    return "URZ" if n == 63 else f"UR{n}"


@dataclass
class Operand:
    """One decoded source/destination operand of FFMA/FADD/FMUL (display helper; edit through Instruction)."""

    kind: str  # "reg", "ureg", "imm", "const", "constx"
    value: int  # register / uniform register index, FP32 bits for imm, bank for const
    offset: int = 0  # byte offset for const / constx
    neg: bool = False
    abs: bool = False
    reuse: bool = False

    @property
    def text(self) -> str:
        if self.kind == "reg":
            core = _reg(self.value)
        elif self.kind == "ureg":
            core = _ureg(self.value)
        elif self.kind == "imm":
            return _fmt_float(self.value)
        elif self.kind == "const":
            off = self.offset - 0x10000 if self.offset >= 0x8000 else self.offset
            core = f"c[0x{self.value:x}][{'-' if off < 0 else ''}0x{abs(off):x}]"
        else:
            core = f"cx[{_ureg(self.value)}][0x{self.offset:x}]"
        if self.abs:
            core = f"|{core}|"
        if self.neg:
            core = f"-{core}"
        if self.reuse:
            core += ".reuse"
        return core

    @property
    def is_register(self) -> bool:
        return self.kind == "reg"

    def __str__(self) -> str:
        return self.text


class Instruction:
    """A decoded 128-bit SASS instruction. Edit the public fields, then call :meth:`encode`.

    Always decoded: ``opcode`` (12 bits, read-only), ``pred``/``pred_neg`` (guard), ``stall``, ``yield_``
    (True = yield active = hi bit 45 clear), ``wbar``, ``rbar``, ``wait``, ``reuse`` (4 bits, 1 = a slot).
    For FFMA/FADD/FMUL also ``rd``, ``ra``, ``rb`` (the lo 32-39 register of R,R,R forms, UR index of UR forms,
    else None) and ``rc`` (the hi 0-7 register, FFMA and non-RRR forms only). All other bits pass through.
    """

    __slots__ = ("lo_raw", "hi_raw", "opcode", "pred", "pred_neg", "stall", "yield_", "wbar", "rbar", "wait",
                 "reuse", "rd", "ra", "rb", "rc", "address")

    def __init__(self, lo: int, hi: int, address: Optional[int] = None) -> None:
        if not (0 <= lo <= MASK64 and 0 <= hi <= MASK64):
            raise ValueError(f"instruction words must be u64, got lo=0x{lo:x} hi=0x{hi:x}")
        self.lo_raw = lo
        self.hi_raw = hi
        self.address = address
        self.opcode = lo & 0xFFF
        self.pred = (lo >> PRED_SHIFT) & 0x7
        self.pred_neg = bool((lo >> 15) & 1)
        self.stall = (hi >> STALL_SHIFT) & STALL_MASK
        self.yield_ = not (hi >> YIELD_BIT) & 1
        self.wbar = (hi >> WBAR_SHIFT) & BAR_MASK
        self.rbar = (hi >> RBAR_SHIFT) & BAR_MASK
        self.wait = (hi >> WAIT_SHIFT) & WAIT_MASK
        self.reuse = (hi >> REUSE_SHIFT) & REUSE_MASK
        self.rd = self.ra = self.rb = self.rc = None
        if self.is_fp32_arith:
            self.rd = (lo >> 16) & 0xFF
            self.ra = (lo >> 24) & 0xFF
            if self.opcode in (0x223, 0x221, 0x220):
                self.rb = (lo >> 32) & 0xFF
            elif self.opcode in (0xC23, 0xE23, 0xE21, 0xC20):
                self.rb = (lo >> 32) & 0x3F
            if self.opcode in FFMA_FORMS:
                self.rc = hi & 0xFF

    # ------------------------------------------------------------------ identity
    @property
    def info(self) -> Optional[OpInfo]:
        return OPCODES.get(self.opcode)

    @property
    def known(self) -> bool:
        """True if the opcode is in :data:`OPCODES`."""
        return self.opcode in OPCODES

    @property
    def opcode_name(self) -> str:
        """Mnemonic (``FFMA``, ``QGMMA``, ``SYNCS.ARRIVE``...) or ``UNKNOWN_0xNNN``."""
        i = OPCODES.get(self.opcode)
        return i.name if i else f"UNKNOWN_0x{self.opcode:03x}"

    @property
    def opcode_class(self) -> str:
        """Coarse class: fp32, fp16, fp64, int, conv, move, uniform, memory, mma, tma, sync, control, other, unknown."""
        i = OPCODES.get(self.opcode)
        return i.klass if i else "unknown"

    @property
    def form(self) -> Optional[str]:
        i = OPCODES.get(self.opcode)
        return i.form if i else None

    @property
    def is_ffma(self) -> bool:
        return self.opcode in FFMA_FORMS

    @property
    def is_fp32_arith(self) -> bool:
        """FFMA, FADD or FMUL (the opcodes whose operands are decoded)."""
        return self.opcode in FFMA_FORMS or self.opcode in FADD_FORMS or self.opcode in FMUL_FORMS

    # ------------------------------------------------------------------ predicate / control
    @property
    def guard_text(self) -> str:
        """``@P0``, ``@!UP1``... or ``""`` for an unconditional (PT) guard."""
        if self.pred == 7 and not self.pred_neg:
            return ""
        uni = OPCODES.get(self.opcode, OpInfo("", "")).uniform_guard
        p = ("UPT" if uni else "PT") if self.pred == 7 else f"{'UP' if uni else 'P'}{self.pred}"
        return f"@{'!' if self.pred_neg else ''}{p}"

    def control_text(self) -> str:
        """CuAssembler-style control text, e.g. ``B--2---:R-:W1:Y:S04``."""
        return format_control(self.stall, self.yield_, self.wbar, self.rbar, self.wait)

    def set_control_text(self, text: str) -> None:
        """Set stall/yield/barriers/wait from control text (see :func:`parse_control_text`)."""
        self.stall, self.yield_, self.wbar, self.rbar, self.wait = parse_control_text(text)

    @property
    def control(self) -> int:
        """The 17-bit control sub-word ``stall | yield_bit << 4 | wbar << 5 | rbar << 8 | wait << 11``."""
        return (self.stall | (0 if self.yield_ else 1) << 4 | self.wbar << 5 | self.rbar << 8 | self.wait << 11)

    # ------------------------------------------------------------------ operands
    def _lo_b_operand(self) -> Operand:
        """The operand encoded in lo bits 32-63 (b slot for most forms, c for 0x423/0x623/0xe23)."""
        lo = self.lo_raw
        if self.rb is not None:
            width = 0xFF if self.opcode in (0x223, 0x221, 0x220) else 0x3F
            lo = (lo & ~(width << 32)) | (self.rb & width) << 32
        neg, ab = bool(lo >> 63 & 1), bool(lo >> 62 & 1)
        op = self.opcode
        if op in (0x223, 0x221, 0x220):
            return Operand("reg", (lo >> 32) & 0xFF, neg=neg, abs=ab)
        if op in (0xC23, 0xE23, 0xE21, 0xC20):
            return Operand("ureg", (lo >> 32) & 0x3F, neg=neg, abs=ab)
        if op in (0x423, 0x823, 0x421, 0x820):
            return Operand("imm", (lo >> 32) & 0xFFFFFFFF)
        bank, off = (lo >> 54) & 0x1F, ((lo >> 40) & 0x3FFF) * 4
        if self.hi_raw >> 27 & 1:
            return Operand("constx", (lo >> 32) & 0x3F, off, neg=neg, abs=ab)
        return Operand("const", bank, off, neg=neg, abs=ab)

    def operands(self) -> List[Operand]:
        """Operands in printed order (destination first) for FFMA/FADD/FMUL; ``[]`` for other opcodes."""
        if not self.is_fp32_arith:
            return []
        h = self.hi_raw
        a = Operand("reg", self.ra, neg=bool(h >> 8 & 1), abs=bool(h >> 9 & 1), reuse=bool(self.reuse & REUSE_A))
        d = Operand("reg", self.rd)
        op = self.opcode
        lob = self._lo_b_operand()
        if op in FFMA_FORMS:
            c = Operand("reg", self.rc, neg=bool(h >> 11 & 1), abs=bool(h >> 10 & 1))
            if op in (0x223, 0x823, 0xA23, 0xC23):  # lo operand is b, hi register is c
                b, cc = lob, c
            else:  # 0x423, 0x623, 0xe23: hi register printed as b, lo operand is c
                b, cc = c, lob
            if b.kind == "reg":
                b.reuse = bool(self.reuse & REUSE_B)
            if cc.kind == "reg":
                cc.reuse = bool(self.reuse & REUSE_C)
            return [d, a, b, cc]
        if lob.kind == "reg":
            # FADD reads its second register through the c port (reuse bit 60); FMUL through b (bit 59).
            lob.reuse = bool(self.reuse & (REUSE_C if op in FADD_FORMS else REUSE_B))
        return [d, a, lob]

    @property
    def scale_register(self) -> Optional[int]:
        """For R,R,R FFMA: the register in the b slot (the promotion scale); else None."""
        return self.rb if self.opcode == 0x223 else None

    def modifiers(self) -> str:
        """Opcode suffix of FFMA/FADD/FMUL as nvdisasm prints it (``.FTZ``, ``.RZ``, ``.SAT``, FMUL ``.D2``...)."""
        if not self.is_fp32_arith:
            return ""
        h = self.hi_raw
        parts = []
        if self.opcode in FADD_FORMS:
            if h >> 16 & 1:
                parts.append("FTZ")
        else:
            dn = (h >> 16 & 1) | (h >> 12 & 1) << 1
            if dn:
                parts.append({1: "FTZ", 2: "FMZ", 3: "INVALID3"}[dn])
        if self.opcode in FMUL_FORMS:
            sc = (h >> 20) & 7
            if sc != 4:
                parts.append(["INVALID0", "D8", "D4", "D2", "", "M2", "M4", "M8"][sc])
        rnd = (h >> 14) & 3
        if rnd:
            parts.append(["", "RM", "RP", "RZ"][rnd])
        if h >> 13 & 1:
            parts.append("SAT")
        return "".join("." + p for p in parts)

    def text(self) -> str:
        """Assembly-like text: guard, mnemonic and, for FFMA/FADD/FMUL, modifiers and operands."""
        g = self.guard_text
        head = (g + " " if g else "") + self.opcode_name
        if self.is_fp32_arith:
            return f"{head}{self.modifiers()} " + ", ".join(o.text for o in self.operands())
        return head

    # ------------------------------------------------------------------ encode
    def encode(self) -> Tuple[int, int]:
        """Re-encode: original words with the decoded fields written back. Raises ValueError on out-of-range fields."""
        _check("pred", self.pred, 7)
        _check("stall", self.stall, 15)
        _check("wbar", self.wbar, 7)
        _check("rbar", self.rbar, 7)
        _check("wait", self.wait, 0x3F)
        _check("reuse", self.reuse, 0xF)
        lo = self.lo_raw & ~(0xF << PRED_SHIFT) & MASK64
        lo |= (self.pred | (0x8 if self.pred_neg else 0)) << PRED_SHIFT
        hi = self.hi_raw & ~CONTROL_MASK_HI & MASK64
        hi |= (self.stall << STALL_SHIFT | (0 if self.yield_ else 1) << YIELD_BIT | self.wbar << WBAR_SHIFT
               | self.rbar << RBAR_SHIFT | self.wait << WAIT_SHIFT | self.reuse << REUSE_SHIFT)
        if self.is_fp32_arith:
            _check("rd", self.rd, 255)
            _check("ra", self.ra, 255)
            lo = (lo & ~(0xFFFF << 16)) | self.rd << 16 | self.ra << 24
            if self.rb is not None:
                width = 0xFF if self.opcode in (0x223, 0x221, 0x220) else 0x3F
                _check("rb", self.rb, width)
                lo = (lo & ~(width << 32)) | self.rb << 32
            if self.rc is not None:
                _check("rc", self.rc, 255)
                hi = (hi & ~0xFF) | self.rc
        return lo & MASK64, hi & MASK64

    def encode_bytes(self) -> bytes:
        lo, hi = self.encode()
        return struct.pack("<QQ", lo, hi)

    # ------------------------------------------------------------------ misc
    def copy(self) -> "Instruction":
        n = Instruction.__new__(Instruction)
        for s in Instruction.__slots__:
            setattr(n, s, getattr(self, s))
        return n

    def __repr__(self) -> str:
        lo, hi = self.encode()
        addr = f"/*{self.address:04x}*/ " if self.address is not None else ""
        return f"<Instruction {addr}{self.text()} [{self.control_text()}] 0x{lo:016x} 0x{hi:016x}>"


def _check(name: str, value: Optional[int], maximum: int) -> None:
    if value is None or not 0 <= value <= maximum:
        raise ValueError(f"field {name}={value!r} out of range 0..{maximum}")


def decode(lo: int, hi: int, address: Optional[int] = None) -> Instruction:
    """Decode one instruction from its two u64 words."""
    return Instruction(lo, hi, address)


def decode_text(text: bytes) -> List[Instruction]:
    """Decode a whole ``.text`` section (length a multiple of 16); ``address`` is set to the byte offset."""
    return [Instruction(lo, hi, 16 * i) for i, (lo, hi) in enumerate(split_words(text))]


def encode_text(instructions: Sequence[Instruction]) -> bytes:
    """Inverse of :func:`decode_text`."""
    return join_words([ins.encode() for ins in instructions])
