"""sass_tools.sass decoder/encoder checked against nvdisasm on every instruction of real NVRTC cubins and on
synthetic words."""

from __future__ import annotations

import math
import os
import random
import sys
from collections import Counter, defaultdict

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_helpers as H  # noqa: E402

from sass_tools.elf import Cubin  # noqa: E402
from sass_tools.sass import (FADD_FORMS, FFMA_FORMS, FMUL_FORMS, OPCODES, Instruction, decode,  # noqa: E402
                             decode_text, encode_text, format_control, is_ffma, parse_control_text)


@pytest.fixture(scope="module")
def corpus():
    """[(build tag, kernel, Instruction, DisLine)] over every instruction of every test cubin."""
    rows = []
    for b in H.all_builds():
        cb = Cubin.from_bytes(b.cubin)
        dis = H.nvdisasm_cubin(b.cubin)
        for k in cb.kernels:
            ins = decode_text(cb.read_text(k))
            assert len(ins) == len(dis[k.name])
            for i, dl in zip(ins, dis[k.name]):
                assert i.address == dl.address
                rows.append((b.tag, k.name, i, dl))
    assert len(rows) > 2000, len(rows)  # several kernels of every family, whatever NVRTC CuPy loads
    assert any(tag.startswith("cupygemm") for tag, *_ in rows)
    return rows


# ---------------------------------------------------------------------------------------------- helpers
_FLOAT_WORDS = {"+INF": math.inf, "-INF": -math.inf}


def _num(tok: str):
    if tok in _FLOAT_WORDS:
        return _FLOAT_WORDS[tok]
    if tok.lstrip("+-") in ("QNAN", "SNAN"):
        return tok
    try:
        return float(tok)
    except ValueError:
        return None


def _same_operand(ours: str, theirs: str) -> bool:
    if ours == theirs:
        return True
    a, b = _num(ours), _num(theirs)
    if isinstance(a, float) and isinstance(b, float):
        if a == b:
            return True
        return math.isclose(a, b, rel_tol=1e-6)  # FP32 immediates: nvdisasm prints ~20 significant digits
    return False


def _split_ops(s: str):
    return [x.strip() for x in s.split(",")] if s else []


def _expected_nvdisasm_reuse(ins: Instruction, text: str) -> str:
    # nvdisasm 13.5 does not print .reuse on an instruction whose yield bit is active (hi bit 45 = 0)
    return text.replace(".reuse", "") if ins.yield_ else text


def _assert_same_fp32_text(ins: Instruction, nv_text: str, where) -> None:
    ours = _expected_nvdisasm_reuse(ins, ins.text())
    og, on = (ours.split(" ", 1) if ours.startswith("@") else ("", ours))
    ng, nn = (nv_text.split(" ", 1) if nv_text.startswith("@") else ("", nv_text))
    assert og == ng, (where, ours, nv_text)
    om, oo = on.split(" ", 1)
    nm, no = nn.split(" ", 1)
    assert om == nm, (where, ours, nv_text)
    oo, no = _split_ops(oo), _split_ops(no)
    assert len(oo) == len(no), (where, ours, nv_text)
    for a, b in zip(oo, no):
        assert _same_operand(a, b), (where, ours, nv_text)


def _name_matches(name: str, mnemonic: str) -> bool:
    return mnemonic == name or mnemonic.startswith(name + ".")


# ---------------------------------------------------------------------------------------------- real cubins
def test_roundtrip_every_instruction(corpus):
    for tag, kname, ins, dl in corpus:
        assert ins.encode() == (dl.lo, dl.hi), (tag, kname, hex(dl.address))
        again = decode(*ins.encode())
        assert again.encode() == (dl.lo, dl.hi)
        assert again.control_text() == ins.control_text()
        assert parse_control_text(ins.control_text()) == (ins.stall, ins.yield_, ins.wbar, ins.rbar, ins.wait)
    # whole-section helpers round trip too
    for b in H.all_builds():
        cb = Cubin.from_bytes(b.cubin)
        for k in cb.kernels:
            t = cb.read_text(k)
            assert encode_text(decode_text(t)) == t


def test_opcode_names_match_nvdisasm(corpus):
    unknown = Counter()
    for tag, kname, ins, dl in corpus:
        if not ins.known:
            unknown[dl.mnemonic] += 1
            continue
        assert _name_matches(ins.opcode_name, dl.mnemonic), (tag, kname, hex(dl.address), ins.opcode_name, dl.text)
    # the table covers every opcode NVRTC emitted for these kernels
    assert not unknown, unknown
    seen = {ins.opcode_name for _, _, ins, _ in corpus}
    for must in ("FFMA", "FADD", "FMUL", "QGMMA", "HGMMA", "IGMMA", "BGMMA", "WARPGROUP", "UTMALDG", "UTMASTG",
                 "UTMACCTL", "UBLKCP", "SYNCS.ARRIVE", "SYNCS.PHASECHK", "SYNCS.EXCH", "USETMAXREG", "EXIT", "BRA",
                 "NOP", "LDL", "STL", "STSM", "LDSM", "LDG", "STG", "LDS", "STS", "BAR", "R2UR", "ELECT"):
        assert must in seen, must
    qg = [ins for _, _, ins, _ in corpus if ins.opcode_name == "QGMMA"]
    assert {i.opcode for i in qg} == {0x9F3, 0xDF3}
    assert all(i.opcode_class == "mma" for i in qg)


def test_guard_predicates_match_nvdisasm(corpus):
    n_guarded = 0
    for tag, kname, ins, dl in corpus:
        assert ins.guard_text == dl.guard, (tag, kname, hex(dl.address), ins.guard_text, dl.text)
        n_guarded += bool(dl.guard)
    assert n_guarded > 50


def test_fp32_operands_match_nvdisasm(corpus):
    n = Counter()
    for tag, kname, ins, dl in corpus:
        if ins.is_fp32_arith:
            _assert_same_fp32_text(ins, dl.text, (tag, kname, hex(dl.address)))
            n[ins.opcode] += 1
            if ins.opcode == 0x223:
                assert ins.scale_register == (dl.lo >> 32) & 0xFF
    assert n[0x223] > 300 and n[0x423] and n[0x823] and n[0xC23] and n[0x221] and n[0x220]


def test_reuse_flags_match_nvdisasm(corpus):
    """Number of ``.reuse`` tokens printed == number of reuse bits (58-60) set, for every opcode, unless yield is
    active (nvdisasm hides reuse then; ptxas never emits yield together with reuse)."""
    total = 0
    for tag, kname, ins, dl in corpus:
        printed = dl.text.count(".reuse")
        if ins.yield_:
            assert printed == 0 and ins.reuse == 0, (tag, kname, dl.text)  # ptxas invariant
            continue
        assert printed == bin(ins.reuse & 0x7).count("1"), (tag, kname, hex(dl.address), dl.text, ins.reuse)
        total += printed
    assert total > 100


def test_scoreboards_consistent(corpus):
    """Every wait-mask bit k refers to a scoreboard that some instruction of the kernel sets (wbar or rbar = k)."""
    by_kernel = defaultdict(list)
    for tag, kname, ins, dl in corpus:
        by_kernel[(tag, kname)].append(ins)
    for key, ins in by_kernel.items():
        produced = {i.wbar for i in ins if i.wbar != 7} | {i.rbar for i in ins if i.rbar != 7}
        waited = {k for i in ins for k in range(6) if i.wait >> k & 1}
        assert waited <= produced, (key, waited, produced)
        assert produced, key
        # the padding after the final BRA is NOPs with zero control apart from the stall-less default
        assert ins[-1].opcode_name == "NOP"


# ---------------------------------------------------------------------------------------------- control fields
def test_control_text_examples():
    # notes 5.1 examples
    i = decode(0x0000000700077223, 0x000FCA0000000007)
    assert (i.opcode_name, i.rd, i.ra, i.rb, i.rc) == ("FFMA", 7, 0, 7, 7)
    assert i.stall == 5 and i.yield_ and i.wbar == 7 and i.rbar == 7 and i.wait == 0 and i.reuse == 0
    assert i.control_text() == "B------:R-:W-:Y:S05"
    j = decode(0x0000008D198A7223, 0x080FE2000000008A)
    assert j.text() == "FFMA R138, R25, R141.reuse, R138"
    assert j.control_text() == "B------:R-:W-:-:S01" and j.scale_register == 141
    q = decode(0x01E00000081879F3, 0x000FE2000C7018FF)
    assert q.opcode_name == "QGMMA" and q.opcode_class == "mma"
    assert format_control(4, True, 1, 7, 0b100) == "B--2---:R-:W1:Y:S04"
    assert parse_control_text("B--2---:R-:W1:Y:S04") == (4, True, 1, 7, 0b100)
    assert parse_control_text("B012345:R3:W-:-:S15") == (15, False, 7, 3, 0x3F)
    for bad in ("", "B--2---:R-:W1:Y", "B--3---:R-:W1:Y:S04", "B------:R8:W1:Y:S04", "B------:R-:W1:Y:S16"):
        with pytest.raises(ValueError):
            parse_control_text(bad)


def test_field_edits_encode_exactly():
    base = decode(0x0000008D198A7223, 0x080FE2000000008A)
    i = base.copy()
    i.yield_ = True
    i.reuse = 0
    assert i.encode() == (0x0000008D198A7223, 0x080FE2000000008A & ~(1 << 45) & ~(0xF << 58))
    i = base.copy()
    i.set_control_text("B-1---5:R2:W3:-:S11")
    lo, hi = i.encode()
    assert lo == base.lo_raw
    assert (hi >> 41) & 0x1FFFF == 11 | 1 << 4 | 3 << 5 | 2 << 8 | 0b100010 << 11
    assert hi & ((1 << 41) - 1) == base.hi_raw & ((1 << 41) - 1) and hi >> 58 == base.hi_raw >> 58
    i = base.copy()
    i.stall = 16
    with pytest.raises(ValueError):
        i.encode()
    i = base.copy()
    i.rd = 256
    with pytest.raises(ValueError):
        i.encode()
    # unknown opcode: passes through untouched, even after a control round trip
    u = decode(0x123456789ABCDFFF, 0x3FFFFFFFFFFFFFFF)
    assert not u.known and u.opcode_name == "UNKNOWN_0xfff" and u.operands() == []
    u.set_control_text(u.control_text())
    assert u.encode() == (0x123456789ABCDFFF, 0x3FFFFFFFFFFFFFFF)
    with pytest.raises(ValueError):
        decode(-1, 0)
    assert is_ffma(0x223) and is_ffma(0xE23) and not is_ffma(0x023) and not is_ffma(0x221)


# ---------------------------------------------------------------------------------------------- synthetic words
def _legal_reuse_bits(op: int):
    """Reuse bits that exist for each FP32 form (nvdisasm rejects the others); 58 = a always."""
    if op in FFMA_FORMS:
        return {0x223: (58, 59, 60), 0x423: (58, 59), 0x623: (58, 59), 0xE23: (58, 59)}.get(op, (58, 60))
    if op == 0x221:
        return (58, 60)
    if op == 0x220:
        return (58, 59)
    return (58,)


def _synthetic_words(seed: int = 1234, per_form: int = 24):
    """Words built by editing Instruction fields of FP32 templates (exercises the encoder)."""
    rnd = random.Random(seed)
    words = []
    for op in list(FFMA_FORMS) + list(FADD_FORMS) + list(FMUL_FORMS):
        for n in range(per_form):
            lo = op | 0x7000
            hi = 0
            if op in (0xC23, 0xE23, 0xE21, 0xC20):
                hi |= 1 << 27  # uniform-operand flag (required by the UR forms)
            if op in FMUL_FORMS:
                hi |= rnd.choice([4, 4, 4, 1, 2, 3, 5, 6, 7]) << 20  # FMUL scale (.D8 ... .M8), 4 = none
            if op in (0x423, 0x823, 0x421, 0x820):
                lo |= rnd.choice([0x3F800000, 0x40490FDB, 0xC0000000, 0x00000000, 0x7F800000, 0x3DCCCCCD,
                                  rnd.getrandbits(32) & 0x7F7FFFFF]) << 32
            elif op in (0x623, 0xA23, 0x621, 0xA20):
                lo |= rnd.randrange(0x1000) << 40 | rnd.randrange(18) << 54  # const offset/4, bank
                if n % 5 == 4:
                    hi |= 1 << 27  # cx[URn][...]
            mod_bits = [8, 9, 13, 14, 15, 16]
            if op in FFMA_FORMS:
                mod_bits += [10, 11, 12]
            for bit in mod_bits:
                if rnd.random() < 0.2:
                    hi |= 1 << bit
            if op not in (0x423, 0x823, 0x421, 0x820) and rnd.random() < 0.3:
                lo |= 1 << rnd.choice([62, 63])  # |b| / -b of the lo-slot operand
            ins = decode(lo, hi)
            ins.rd = rnd.choice([0, 1, 7, 100, 200, 254, 255])
            ins.ra = rnd.randrange(256)
            if ins.rb is not None:
                ins.rb = rnd.randrange(64 if op in (0xC23, 0xE23, 0xE21, 0xC20) else 256)
            if ins.rc is not None:
                ins.rc = rnd.randrange(256)
            ins.pred = rnd.randrange(8)
            ins.pred_neg = rnd.random() < 0.3
            # nvdisasm only accepts some (stall, yield, reuse) combinations: stall 0 needs yield and no reuse,
            # stall 12-15 needs yield, yield excludes reuse b+c / a+b+c (ptxas never yields with any reuse).
            ins.yield_ = rnd.random() < 0.3
            ins.stall = rnd.randrange(1, 16) if ins.yield_ else rnd.randrange(1, 12)
            ins.wbar = rnd.choice([0, 1, 2, 3, 4, 5, 7, 7])
            ins.rbar = rnd.choice([0, 1, 2, 3, 4, 5, 7, 7])
            ins.wait = rnd.randrange(64)
            ins.reuse = 0
            if not ins.yield_:
                for bit in _legal_reuse_bits(op):
                    if rnd.random() < 0.4:
                        ins.reuse |= 1 << (bit - 58)
            words.append(ins.encode())
    return words


def test_synthetic_fp32_words_vs_nvdisasm():
    words = _synthetic_words()
    good, bad = H.nvdisasm_raw(words)
    assert not bad, {hex(words[i][0] & 0xFFF): m for i, m in list(bad.items())[:5]}
    assert len(good) == len(words)
    forms = Counter()
    for i, (lo, hi) in enumerate(words):
        ins = decode(lo, hi)
        _assert_same_fp32_text(ins, good[i], (i, hex(lo), hex(hi)))
        assert ins.encode() == (lo, hi)
        forms[ins.opcode] += 1
    assert set(forms) == set(FFMA_FORMS) | set(FADD_FORMS) | set(FMUL_FORMS)


def test_opcode_table_vs_nvdisasm(corpus):
    """Every table entry not seen in the real cubins is checked on a probe word (opcode, other operand bits 0)."""
    seen = {ins.opcode for _, _, ins, _ in corpus}
    # Verified on real NVRTC code (VIMNMX with a uniform operand, emitted by earlier kernel versions); as a probe word
    # with all operand bits 0 nvdisasm rejects it.
    real_code_only = {0xC48}
    probe_ops = sorted(op for op in OPCODES if op not in seen and op not in real_code_only)
    ctrl = 0x000FE20000000000 | 7 << 46 | 7 << 49
    words = []
    for op in probe_ops:
        hi = ctrl | (1 << 27 if op in (0xE23, 0xE21, 0xC20) else 0) | (4 << 20 if op in FMUL_FORMS else 0)
        words.append((op | 0x7000, hi))
    good, bad = H.nvdisasm_raw(words)
    assert not bad, {hex(probe_ops[i]): m for i, m in bad.items()}
    for i, op in enumerate(probe_ops):
        mnemonic = good[i].split()[0]
        assert _name_matches(OPCODES[op].name, mnemonic), (hex(op), OPCODES[op].name, good[i])


def test_uniform_guard_table(corpus):
    """Set guard P1 / !P3 on one instance of every table opcode (a real one, else a probe word): nvdisasm prints
    @P1 or @UP1 (uniform-datapath ops) exactly as we do."""
    first = {}
    for _, _, ins, _ in corpus:
        first.setdefault(ins.opcode, ins)
    ctrl = 0x000FE20000000000 | 7 << 46 | 7 << 49
    for op in OPCODES:
        if op not in first:
            hi = ctrl | (1 << 27 if op in (0xE23, 0xE21, 0xC20) else 0) | (4 << 20 if op in FMUL_FORMS else 0)
            first[op] = decode(op | 0x7000, hi)
    words, exp = [], []
    for op, ins in sorted(first.items()):
        for pred, neg in ((1, False), (3, True)):
            j = ins.copy()
            j.pred, j.pred_neg = pred, neg
            words.append(j.encode())
            exp.append(j.guard_text)
    good, bad = H.nvdisasm_raw(words)
    assert len(good) >= len(words) - 4, bad  # a guard is illegal on very few opcodes
    for i, text in good.items():
        assert text.split()[0] == exp[i], (hex(words[i][0] & 0xFFF), text, exp[i])


def test_control_fields_vs_nvdisasm_legality():
    """nvdisasm validates (stall, yield, reuse) combinations of FFMA; the illegal set it reports, expressed in our
    decoded fields, is exactly: stall 0 without yield, stall 12-15 without yield, stall 0 + yield with any reuse, and
    yield with reuse b+c or a+b+c. This pins the stall/yield/reuse bit positions against NVIDIA's tool."""
    base = decode(0x0000008D198A7223, 0x080FE2000000008A)
    words, fields = [], []
    for stall in range(16):
        for y in (False, True):
            for reuse in range(8):
                i = base.copy()
                i.stall, i.yield_, i.reuse = stall, y, reuse
                words.append(i.encode())
                fields.append((stall, y, reuse))
    good, bad = H.nvdisasm_raw(words)

    def illegal(stall, y, reuse):
        if not y:
            return stall == 0 or stall >= 12
        return (stall == 0 and reuse != 0) or reuse in (6, 7)

    assert {i for i in range(len(words)) if illegal(*fields[i])} == set(bad)
    for i, text in good.items():  # reuse is displayed exactly when yield is off
        st, y, reuse = fields[i]
        assert text.count(".reuse") == (0 if y else bin(reuse).count("1")), (fields[i], text)


def test_scoreboard_semantics(corpus):
    """Variable-latency producers (global/shared/constant/local loads, S2R) allocate a write scoreboard (all but the
    odd dead load, e.g. CUDA 13's unused ``LDC R1, c[0x0][0x28]`` stack-pointer load)."""
    n = with_sb = 0
    for tag, kname, ins, dl in corpus:
        if ins.opcode_name in ("LDG", "LDS", "LDC", "LDL", "S2R", "LDSM"):
            n += 1
            with_sb += ins.wbar != 7
        if dl.text == "NOP":  # a NOP produces nothing (it may still wait on scoreboards, as ptxas uses it)
            assert ins.wbar == 7 and ins.rbar == 7
    assert n > 50 and with_sb >= 0.9 * n, (with_sb, n)
