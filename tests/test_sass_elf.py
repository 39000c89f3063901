"""sass_tools.elf against NVRTC-built CUDA 12 (ABI 7) and CUDA 13 (ABI 8) cubins and NVIDIA's tools."""

from __future__ import annotations

import os
import re
import struct
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_helpers as H  # noqa: E402

from sass_tools.elf import EICOMPAT_NAMES, EIATTR_NAMES, Cubin  # noqa: E402


def _all():
    return H.all_builds()


@pytest.fixture(scope="module")
def builds():
    return _all()


def test_toolchains_present():
    """Both cubin formats must be exercised: CUDA 12 (ABI 7) and CUDA 13 (ABI 8)."""
    b12, b13 = H.builds_cuda12(), H.builds_cuda13()
    assert b12[0].version[0] == 12 and b13[0].version[0] == 13
    assert Cubin.from_bytes(b12[0].cubin).abi_version == 7
    assert Cubin.from_bytes(b13[0].cubin).abi_version == 8


def test_roundtrip_byte_identical(builds):
    for b in builds:
        cb = Cubin.from_bytes(b.cubin)
        assert cb.to_bytes() == b.cubin, b.tag
        # re-parsing the output gives the same structure
        cb2 = Cubin.from_bytes(cb.to_bytes())
        assert [k.name for k in cb2.kernels] == [k.name for k in cb.kernels]


def test_header_facts(builds):
    for b in builds:
        cb = Cubin.from_bytes(b.cubin)
        assert cb.e_machine == 190 and cb.e_type == 2, b.tag
        assert cb.sm == 90 and cb.is_arch_specific and cb.arch == "sm_90a", b.tag
        assert cb.toolkit_version == b.version, b.tag
        if b.version[0] == 12:
            assert (cb.osabi, cb.abi_version) == (0x33, 7)
            assert cb.e_flags == 0x005A0D5A
            assert cb.e_version == 10 * b.version[0] + b.version[1]  # 0x80 = 12.8, 0x81 = 12.9
        else:
            assert (cb.osabi, cb.abi_version) == (0x41, 8)
            assert cb.e_flags == 0x06005A04 and cb.e_version == 1
            assert cb.has_section(".nv.compat") and cb.has_section(".note.nv.cuinfo")


def test_kernels_vs_cuobjdump_res_usage(builds):
    for b in builds:
        cb = Cubin.from_bytes(b.cubin)
        ru = H.res_usage(b.cubin)
        assert sorted(ru) == sorted(k.name for k in cb.kernels), b.tag
        for k in cb.kernels:
            assert k.registers == ru[k.name]["REG"], (b.tag, k.name)
            assert k.shared_bytes == ru[k.name]["SHARED"], (b.tag, k.name)
            assert (k.frame_size or 0) == ru[k.name]["STACK"], (b.tag, k.name)
            assert k.text_size % 128 == 0 and k.text_size >= k.code_size > 0
            sec = cb.sections[k.text_section]
            assert sec.name == f".text.{k.name}" and sec.info == k.symbol_index
            assert cb.symbols[k.symbol_index].is_entry


def test_kernel_attributes(builds):
    for b in builds:
        if b.source != "gemm":
            continue
        cb = Cubin.from_bytes(b.cubin)
        assert sorted(k.name for k in cb.kernels) == sorted(H.GEMM_KERNELS)
        for k in cb.kernels:
            assert k.max_threads == (b.launch_threads, 1, 1), (b.tag, k.name)
            # __launch_bounds__(384, 1) caps registers at 168; (128, 1) leaves the 255 default
            assert k.max_reg_count == (168 if b.launch_threads == 384 else 255), (b.tag, k.name)
            assert k.exit_offsets and all(o % 16 == 0 and o < k.text_size for o in k.exit_offsets)
            assert k.cuda_api_version == 10 * b.version[0] + b.version[1]
            for off in k.exit_offsets:  # EXIT_INSTR_OFFSETS point at EXIT instructions (opcode 0x94d)
                lo = struct.unpack_from("<Q", b.cubin, k.text_offset + off)[0]
                assert lo & 0xFFF == 0x94D
        tma = cb.kernel("tma_pipeline")
        assert tma.shared_bytes >= 2 * 128 * 64 + 128 * 4 + 16
        assert tma.num_mbarriers == 2 and tma.reg_reconfig and tma.num_barriers == 1
        assert tma.attribute("CTA_PER_CLUSTER") is not None and tma.attribute("CTA_PER_CLUSTER").u32s() == [2, 1, 1]
        q = cb.kernel("qgmma_promote")
        assert q.registers >= 128 and q.param_size == 8 + 8 + 8 + 8 + 4
        sf = cb.kernel("scalar_forms")
        assert sf.param_size == 8 + 8 + 4 + 4 + 4 and sf.shared_bytes == 0 and not sf.reg_reconfig


def _cuobjdump_attr_names(out: str):
    """{section name: [attribute names in order]} from ``cuobjdump -elf``."""
    res = {}
    for block in re.split(r"\n(?=\.nv\.info|\.nv\.compat)", out):
        m = re.match(r"(\.nv\.info\S*|\.nv\.compat)\n", block)
        if m:
            res[m.group(1)] = re.findall(r"Attribute:\t(\S.*)", block)
    return res


def test_nv_info_attribute_names_vs_cuobjdump(builds):
    """Every .nv.info / .nv.info.K / .nv.compat record parses, in order, and known names match cuobjdump -elf."""
    for b in builds:
        cb = Cubin.from_bytes(b.cubin)
        names = _cuobjdump_attr_names(H.cuobjdump(["-elf"], b.cubin))
        assert ".nv.info" in names
        for sec, cu in names.items():
            if sec == ".nv.compat":
                attrs = cb.compat_info
            elif sec == ".nv.info":
                attrs = cb.global_info
            else:
                attrs = cb.kernel(sec[len(".nv.info."):]).attributes
            assert len(attrs) == len(cu), (b.tag, sec)
            for a, n in zip(attrs, cu):
                table = EICOMPAT_NAMES if sec == ".nv.compat" else EIATTR_NAMES
                if a.attr in table:
                    assert a.name == n, (b.tag, sec, hex(a.attr))
                else:
                    assert "UNKNOWN" in a.name


def test_text_offsets_match_disassembly(builds):
    """Instruction at SASS address A of kernel K == bytes at sh_offset(.text.K) + A (nvdisasm -hex words)."""
    for b in builds:
        cb = Cubin.from_bytes(b.cubin)
        dis = H.nvdisasm_cubin(b.cubin)
        assert sorted(dis) == sorted(k.name for k in cb.kernels)
        for k in cb.kernels:
            words = cb.instructions(k)
            assert len(dis[k.name]) == len(words), (b.tag, k.name)
            for dl in dis[k.name]:
                assert words[dl.address // 16] == (dl.lo, dl.hi), (b.tag, k.name, hex(dl.address))


def test_in_place_patch_and_errors(builds):
    b = builds[0]
    cb = Cubin.from_bytes(b.cubin)
    k = cb.kernel("qgmma_promote")
    lo, hi = cb.instructions(k)[3]
    cb.set_instruction(k, 3, lo, hi ^ (1 << 45))
    out = cb.to_bytes()
    assert len(out) == len(b.cubin)
    diff = [i for i in range(len(out)) if out[i] != b.cubin[i]]
    assert diff == [k.text_offset + 3 * 16 + 8 + 5]  # bit 45 of hi = byte 5 of hi, bit 5
    assert Cubin.from_bytes(out).instructions(k.name)[3] == (lo, hi ^ (1 << 45))
    with pytest.raises(ValueError):
        cb.write_text(k, b"\x00" * 16)
    with pytest.raises(IndexError):
        cb.set_instruction(k, k.text_size // 16, 0, 0)
    with pytest.raises(KeyError):
        cb.kernel("nope")
    text = cb.read_text(k)
    cb.write_text(k, text)
    assert cb.to_bytes() == out


def test_invalid_inputs(builds):
    good = builds[0].cubin
    with pytest.raises(ValueError, match="magic"):
        Cubin.from_bytes(b"")
    with pytest.raises(ValueError, match="magic"):
        Cubin.from_bytes(b"hello world, not an ELF")
    with pytest.raises(ValueError, match="magic"):
        Cubin.from_bytes(b"\x7fEL")
    with pytest.raises(ValueError, match="truncated"):
        Cubin.from_bytes(good[:40])
    with pytest.raises(ValueError, match="e_machine"):
        Cubin.from_bytes(good[:18] + struct.pack("<H", 62) + good[20:])  # EM_X86_64
    with pytest.raises(ValueError, match="ELFCLASS64"):
        Cubin.from_bytes(good[:4] + b"\x01" + good[5:])
    with pytest.raises(ValueError, match="truncated"):
        Cubin.from_bytes(good[: len(good) // 2])
    # CuPy's getCUBIN drops the last byte: that must be reported, not silently accepted
    with pytest.raises(ValueError, match="truncated"):
        Cubin.from_bytes(good[:-1])
    with pytest.raises(TypeError):
        Cubin.from_bytes("not bytes")  # type: ignore[arg-type]


def test_cupy_getcubin_missing_byte():
    """Documented CuPy gotcha: nvrtc.getCUBIN returns the image minus its last byte."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(H.VARIANTS_SRC, "v.cu", (), ())
    try:
        nvrtc.compileProgram(prog, H.NVRTC_OPTS)
        raw = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    with pytest.raises(ValueError, match="truncated"):
        Cubin.from_bytes(raw)
    cb = Cubin.from_bytes(raw + b"\x00")
    assert [k.name for k in cb.kernels] == ["gmma_variants"]
