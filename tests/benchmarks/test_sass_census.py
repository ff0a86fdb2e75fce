"""benchmarks/sass_census.py counts a kernel's main loop in a cuobjdump listing."""

from __future__ import annotations

from benchmarks.sass_census import loop_census

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                     /* 0x0000000000007919 */
        /*0020*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR20].tnspB, RZ, !UPT ;
        /*0030*/              @!P1 LDGSTS.E.BYPASS.128 [R97], desc[UR16][R90.64], P1 ;
        /*0040*/                   MUFU.EX2 R33, R32 ;                    /* 0x0000002000217308 */
        /*0050*/               @P0 BRA 0x10 ;                             /* 0xffffffe400181947 */
        /*0060*/                   HGMMA.64x32x16.F32.BF16 R40, gdesc[UR4].tnspB, R40 ;
        /*0070*/               @P2 BRA 0x60 ;
        /*0080*/                   EXIT ;
        /*0090*/                   BRA 0x90;
"""


def test_the_longest_loop_is_counted_by_opcode() -> None:
    scope, n, ops, inner = loop_census(LISTING)
    # 0x10 .. 0x50: the longest backward branch; the self-branch after EXIT is no loop
    assert scope == "main loop" and n == 5 and inner == []
    assert (ops["S2R"], ops["HGMMA"], ops["LDGSTS"], ops["MUFU"], ops["BRA"]) == (1, 1, 1, 1, 1)
    assert ops["MOV"] == 0 and ops["EXIT"] == 0


def test_a_listing_without_a_loop_is_counted_whole() -> None:
    listing = "        /*0000*/  STL [R1], R2 ;\n        /*0010*/  EXIT ;\n        /*0020*/  BRA 0x20;\n"
    scope, n, ops, inner = loop_census(listing)
    assert scope == "whole kernel" and n == 3 and ops["STL"] == 1 and inner == []


def test_loops_inside_the_main_loop_are_counted_with_their_depth() -> None:
    """A loop whose body runs several times a main-loop step is listed apart, at its nesting depth."""
    listing = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR20].tnspB, RZ, !UPT ;
        /*0020*/                   STL [R1], R2 ;
        /*0030*/                   LDL R2, [R1] ;
        /*0040*/               @P1 BRA 0x30 ;
        /*0050*/               @P2 BRA 0x20 ;
        /*0060*/               @P0 BRA 0x10 ;
        /*0070*/                   EXIT ;
"""
    scope, n, ops, inner = loop_census(listing)
    assert scope == "main loop" and n == 6 and ops["STL"] == 1 and ops["LDL"] == 1
    assert [(depth, size, c["STL"], c["LDL"]) for depth, size, c in inner] == [(1, 4, 1, 1), (2, 2, 0, 1)]
