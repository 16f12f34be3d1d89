"""Ulysses attention: a FlashAttention forward whose epilogue sends each output tile to the rank that owns it.

Ulysses sequence parallelism shards the sequence over P ranks; a pre-attention all-to-all gives every rank the
full sequence for H/P heads, attention runs locally, and a post-attention all-to-all returns every rank its
own sequence rows for all H heads. Here that post-attention all-to-all is fused into the attention kernel tile
by tile: the program that finishes an output tile [BLOCK_M rows, one head] stores it straight into the owning
rank's output buffer through a symmetric-memory peer pointer and goes back to computing its next tile. There
is no communication warp or program: the stores drain through NVLink (the X-Stage) while the SM computes, so
the all-to-all hides behind attention as long as bursts stay below the link's outstanding capacity. It wins
over attention-then-all-to-all when the all-to-all is a sizeable share of the layer (short and medium
sequences); at long sequences the fused kernel approaches attention alone.

Version ladder (each a figure's bar, each selected by constexprs of one kernel):
  1. FUSED=False: plain FlashAttention forward (online softmax in base 2, as triton-lang's 06 tutorial),
     output in this rank's layout [S, Hc, D]; "our attention alone", and the first half of the serial baseline.
  2. FUSED=True: the same compute; the epilogue routes each row to its owner rank (row // Sl) and local row
     (row % Sl) through a table of every rank's output base address, so a tile that straddles two ranks (Sl
     not a multiple of BLOCK_M) is split row by row.
  +  TIMED (either variant): the global timer at each program's start and after its last store was issued
     (CTA barrier first); sender-visible time = max(last store) - min(start) over programs.

Speed ladder of the attention itself (rung = launch configuration of the same kernel, picked per shape by
``xstage.ulysses_sweep.tune_config``). Measured on one H200 (run U2 of docs/lab-notebook.md, 2026-12-01,
``scripts/ulysses_one_gpu.sh``: the tuner's log; bf16, non-causal, S = 32,768, 12 heads x 128 = one rank's heads at
P = 2, 6.60e12 FLOPs; TFLOP/s = FLOPs / median of 5 event-timed runs):
  a. BM 128, BN 64, 4 warps, 2 stages, pointer loads (the untuned default)          13.99 ms   472 TFLOP/s
  b. BM 128, BN 64, 8 warps, 3 stages, pointer loads                                13.10 ms   503 TFLOP/s
  c. b with K/V through TMA tensor descriptors                                      12.77 ms   517 TFLOP/s
  d. BM 128, BN 128, 8 warps, 3 stages, TMA (chosen at every S >= 8K, D = 128)      11.77 ms   561 TFLOP/s
  e. c with 4 stages (issue 14: a deeper K/V pipeline; not chosen anywhere)         12.75 ms   517 TFLOP/s
  d in the sweep's own timing (median of 10, round-robin with the other methods; attention_only):  544 TFLOP/s
  cuDNN SDPA on the same shape, same run (data/h200x1/ulysses_local, sdpa_only):            643 TFLOP/s
So ours was 0.84-0.87 of cuDNN at S >= 8K, D = 128 (and 1.04 at CogVideoX's 17,776 x 48 x 64) in run U2.

Round 2 (run L1 of docs/lab-notebook.md, 2026-12-01, ``scripts/attention_ladder.py``, Triton 3.6; record
data/h200x1/attention_ladder/; every variant first checked against float32 and the fused layer bit for bit, then
timed round-robin with cuDNN SDPA, medians of 10; 24 heads x 128 = one layer on one GPU; TFLOP/s at S = 8K / 16K /
32K, ours / cuDNN in brackets):
  d. BM 128, BN 128, 8 warps, 3 stages, TMA (the U2 choice)          510 / 514 / 529   (0.86 / 0.85 / 0.84)
  f. d + WS (key loop as tl.range(..., warp_specialize=True))       504 / 512 / 530   (0.86 / 0.85 / 0.85)
  g. f with 2 stages                                                 432 / 438 / 418   (0.72 / 0.66 / 0.63)
  h. d + PERSISTENT (132 programs looping over tiles)                546 / 519 / 542   (0.89 / 0.86 / 0.87)  <- kept
  i. h + WS (PTX identical to h's: the spread is run noise)          514 / 521 / 538   (0.87 / 0.86 / 0.86)
  j. BM 256, BN 64, 8 warps, 3 stages, TMA                           527 / 487 / 491   (0.84 / 0.79 / 0.76)
  k. j with 2 stages                                                 391 / 428 / 414   (0.67 / 0.64 / 0.61)
  -  BM 128, BN 64, 4 warps, 3 stages, TMA + WS: does not compile (NVGPUWarpSpecialization pass fails)
  D = 64 at 30,000 x 20 x 64 (masked last key block): BM 128 / BN 128 / 4 warps / 3 stages / TMA 427 TFLOP/s
  (1.05 x cuDNN) stays best; + PERSISTENT 305 (28 spilled registers), 8 warps + WS 363, BM 256 / BN 128 392,
  BM 256 / BN 64 340; 4 warps + WS does not compile.
h is a tuner candidate (``xstage.ulysses.H200_CONFIGS[128]``). The goal (>= 0.95 of the FA-class kernel) is still
not met: ours is at most 0.89 of cuDNN SDPA at D = 128, and the issue measured the CuTe FA kernel above cuDNN.
Warp specialisation as Triton 3.6 offers it on Hopper does nothing for this loop: i compiled to the same PTX as h
(sidecar ``checks``: ptx_sha256), no variant has ``setmaxnreg`` (no register reallocation between warpgroups), and
f times as d; h vs i (same code) shows the spread between timing blocks: up to 6 % at 8K, <= 1 % at 16K / 32K; FA3's ping-pong of two warpgroups and its intra-warpgroup softmax/MMA overlap are not expressible
through it. Left: BM = 64 per warpgroup with explicit ping-pong (Gluon), a head-major (L2-friendlier) persistent
tile order.

Round 3 (issue 14, beside FA4's CuTe Hopper forward in the same run: ``scripts/attention_vs_fa4.sh``, record
data/h200x1/attention_vs_fa4/, docs/lab-notebook.md, "Ulysses round 3"). Levers added as constexprs (``AttnConfig`` fields):
PIPE (the key loop software-pipelined in the source: block j+1's q K^T issued before block j's softmax),
SCALE_Q (softmax scale x log2 e folded into q once per tile), and two launch options: a register cap
(``maxnreg``: 128 lets two 8-warp programs share an SM) and persistent programs per SM (``per_sm``).
Compiled for sm_90a on the CPU: the base rung h holds 196 registers and 229 KB of shared memory, so one program (two
warpgroups) per SM, and Triton waits for every wgmma group right after issuing it (q K^T, then P V), PIPE too:
the softmax never runs under the tensor cores inside a program; two programs per SM is the overlap Triton leaves
to the warp schedulers. BLOCK_M 192 / BLOCK_N 176 / 12 warps are not expressible (powers of two).
Measured (run G4, 2026-12-01, Triton 3.6 / torch 2.11, commit dc931ba; record data/h200x1/attention_vs_fa4/,
``studies.attention_vs_fa4_summary``): every variant checked (float32 2.3e-3 .. 2.9e-3, fused bit for bit), every
shape's three methods within 2.9e-3 of float32 on 256 sampled rows, then ours, cuDNN and FA4's kernel timed in the
same rounds (medians of 10 samples of 2 back-to-back launches). [S, H, D] per rank; TFLOP/s, ours / FA4 in brackets:
  rung (D = 128)                        8192x24     16384x24    32768x12    49152x12    32760x6     4096x12
  h. 128x128 w8 s3 TMA pers (base)      544 (0.78)  523 (0.77)  524 (0.77)  535 (0.79)  506 (0.72)  449 (0.75)
  l. 128x64 w8 s2 TMA r128 (2 per SM)   452 (0.67)  461 (0.66)  455 (0.65)  435 (0.64)  486 (0.69)  271 (0.54)
  m. l, persistent, 2 programs per SM   439 (0.63)  431 (0.61)  453 (0.65)  439 (0.64)  459 (0.64)  252 (0.51)
  n. 64x64 w4 s3 TMA (2 per SM)         512 (0.76)  496 (0.74)  492 (0.74)  497 (0.73)  422 (0.61)  355 (0.68)
  o. h + SCALE_Q (237 registers)        462 (0.68)  465 (0.67)  461 (0.66)  466 (0.69)  505 (0.71)  371 (0.66)
  FA4's kernel, same rounds (median)    681         693         696         679         707         525
  rung (D = 64)                         30000x20    17776x24
  p. 128x128 w4 s3 TMA (base)           428 (0.75)  419 (0.74)
  q. 128x64 w8 s3 TMA                   406 (0.71)  388 (0.70)
  r. 128x128 w8 s2 TMA r128             430 (0.76)  414 (0.74)
  s. 64x128 w4 s2 TMA (3 per SM)        430 (0.77)  406 (0.76)
  t. p + SCALE_Q                        438 (0.77)  421 (0.76)
  FA4's kernel, same rounds (median)    569         557
PIPE (128x64 w8 s3 TMA pers) was timed only in run G2 (record attention_vs_fa4_late_v, where every other rung ran
with V loaded after the softmax): 434-460 TFLOP/s at D = 128, S >= 8K (0.63-0.68 of FA4), i.e. below h; it
cannot launch where S is not a multiple of 64 (311 KB of shared memory with the masked tail block).
No lever beats h at D = 128; at D = 64, r / s / t are within +0.4 .. +2.3 % of p at 30000x20 and -3.0 .. +0.6 % at
17776x24: within the spread between timing blocks (FA4's own median moves 1.4-6 % between the blocks of one run at
S >= 8K), so no default changed. Ours / FA4: 0.72-0.79 at S >= 8K (goal 0.95: not met). Two programs per SM do not overlap what FA
overlaps: the cap to 128 registers is met without spills, yet l / m lose 10-20 %, so Triton's wgmma loop is not
limited by a lack of co-resident warpgroups alone.

Round 4 (issue 14; run C3 of docs/lab-notebook.md "Ulysses round 4", 2026-12-01, commit 4c41c3d, Triton 3.6; record
data/h200x1/attention_vs_fa4_gluon/, ``STUDY=gluon scripts/attention_vs_fa4.sh``): the same forward written in Gluon
(kernels/attention_gluon.py: asynchronous wgmma, the softmax of key block j under P_{j-1} V_{j-1}; ``wgmma.wait_group 1``
in its PTX), checked against float32 (2.2e-3 .. 2.3e-3) and timed beside the base rung h / p, FA4 and cuDNN in the same
rounds (medians of 10 samples of 2 launches). It has no fused epilogue yet. TFLOP/s, ours / FA4 in brackets:
  rung (D = 128)                        8192x24     16384x24    32768x12    49152x12    32760x6     4096x12
  h. Triton base (this kernel)          540 (0.78)  537 (0.77)  535 (0.77)  544 (0.79)  512 (0.72)  453 (0.74)
  u. gluon 128x128, 8 warps, 2 stages   461 (0.66)  458 (0.65)  460 (0.64)  471 (0.68)  429 (0.58)  324 (0.61)
  v. gluon 64x64, 4 warps, 2 stages     507 (0.76)  519 (0.78)  526 (0.78)  528 (0.77)  456 (0.65)  372 (0.67)
  w. gluon 64x64, 4 warps, 3 stages     531 (0.80)  538 (0.81)  547 (0.82)  551 (0.81)  499 (0.72)  372 (0.68)
  x. gluon warp-specialised 128x128 s2  592 (0.88)  619 (0.92)  632 (0.93)  645 (0.94)  474 (0.66)  352 (0.66)
  rung (D = 64)                         30000x20    17776x24
  p. Triton base (this kernel)          430 (0.75)  419 (0.74)
  y. gluon 64x128, 4 warps, 3 stages    446 (0.80)  432 (0.79)
  -  gluon 64x128, 4 warps, 2 stages    446 (0.80)  428 (0.79)
  -  gluon warp-specialised 128x128 s3  390 (0.67)  376 (0.66)
  -  gluon 128x128, 8 warps, 2 stages   338 (0.58)  330 (0.57)
u runs its two warpgroups in step (Triton puts a CTA-wide bar.sync before each mbarrier wait and between each TMA
expect and copy when the same warps issue the TMA: 4 per key block); v / w are one warpgroup per CTA, two CTAs per
SM; x is FA3's CTA (a 1-warp TMA loader partition, two consumer warpgroups of 64 rows sharing a 128-row tile's K/V
ring through ready / empty mbarriers, setmaxnreg 248 / 232 / 24): +10 .. +19 % over h at S >= 8K with 12-24 heads,
0.88-0.94 of FA4 there (goal 0.95: not met). A likely cause of its loss on 32760x6 and at D = 64 (S % 128 != 0 in all
three): the Gluon kernel applies the key mask to every block when S is not a multiple of BLOCK_N, not only to the
last one (neither changed nor measured yet). The fused Ulysses epilogue on the Gluon kernel can follow once it is at
FA4's speed (not started).

Round 5 (issue 14; call U3 of docs/lab-U-session8.md, 2026-12-02, commit 8f322c0, Triton 3.6; record
data/h200x1/attention_vs_fa4_gluon_next/, ``STUDY=gluon_next scripts/attention_vs_fa4.sh``): the key mask on the last
block only (``-ml``), FA3's ping-pong of the consumers (``-pp``, turn mbarriers) and FA4's D = 64 tile (192 rows:
three consumer warpgroups), checked against float32 (2.23e-3 .. 2.31e-3) and timed beside the base rung and cuDNN in
the same rounds. **FA4 did not run in this call** (the carried stack lacked nvidia-cutlass-dsl-libs-core: recorded as
``fa4_absent``), so the brackets are ours / cuDNN of the same block, not ours / FA4. TFLOP/s:
  rung (D = 128)                        8192x24     16384x24    32768x12    49152x12    32760x6     4096x12
  h. Triton base (this kernel)          554 (0.86)  533 (0.86)  533 (0.86)  544 (0.85)  513 (0.89)  337 (0.76)
  x. gluon ws 128x128 s2                634 (0.99)  625 (1.05)  639 (1.07)  655 (1.09)  468 (0.80)  346 (0.73)
  z. x with the last-block mask (-ml)   636 (0.98)  633 (1.06)  643 (1.07)  657 (1.09)  624 (1.12)  453 (0.87)
  -  z with the ping-pong (-ml-pp)      611 (0.97)  610 (1.01)  618 (1.03)  636 (1.05)  604 (1.10)  331 (0.76)
  -  z-pp with a 3-slot ring            595 (0.96)  608 (1.00)  617 (1.02)  631 (1.02)  607 (1.10)  288 (0.71)
  rung (D = 64)                         30000x20    17776x24
  p. Triton base (this kernel)          434 (1.05)  421 (1.04)
  y. gluon 64x128 w4 s3 (-ml)           450 (1.12)  441 (1.11)
  -  gluon ws 128x128 s3 (-ml)          455 (1.11)  437 (1.09)
  -  gluon ws 192x128 s2, 3 consumers   514 (1.26)  494 (1.25)
  zz. the same with the ping-pong       531 (1.30)  512 (1.29)
The last-block mask is the Wan shape's and D = 64's missing piece (+33 % on 32760x6, +16 % for ws at D = 64; on the
shapes with S % 128 == 0 it changes nothing at S >= 8K); the ping-pong costs 3-4 % with two consumers at D = 128 and
gains 3 % with three at D = 64. Against run C3's FA4 (another run; cuDNN moved by <= 2 % between the runs at S >=
8K) z would be 0.94 / 0.94 / 0.95 / 0.96 / 0.88 and zz 0.92 / 0.91: an estimate, not the measured ratio.

Session 8, call S8-U4 (record data/h200x1/attention_vs_fa4_gluon_best/): z and zz beside FA4 in the same rounds:
z 0.883 / 0.934 / 0.950 / 0.955 of FA4 at 8192x24 / 16384x24 / 32768x12 / 49152x12, 0.890 on 32760x6; zz 0.925 /
0.941 at D = 64. Session 9, call U4 (docs/lab-notebook.md; 2026-12-02, commit 835fe12, record
data/h200x1/attention_vs_fa4_gluon_pe/, ``STUDY=gluon_pe scripts/attention_vs_fa4.sh``): the persistent ws grid
(``-pe``: one CTA per SM walking tiles, the output staged apart from Q so the next tile's Q and K/V load under the
last P V and the epilogue), TFLOP/s (ours / FA4 of the same block):
  rung (D = 128)                        8192x24     16384x24    32768x12    49152x12    32760x6     4096x12
  h. Triton base (this kernel)          528 (0.78)  524 (0.77)  518 (0.76)  532 (0.79)  494 (0.71)  418 (0.72)
  z. gluon ws -ml                       600 (0.89)  627 (0.95)  639 (0.97)  645 (0.96)  606 (0.89)  311 (0.62)
  pe. z on the persistent grid (-pe)    607 (0.93)  630 (0.96)  628 (0.96)  642 (0.96)  606 (0.90)  355 (0.72)
  -  pe with the ping-pong (-ml-pp-pe)  588 (0.91)  608 (0.92)  611 (0.93)  625 (0.93)  588 (0.86)  452 (0.79)
  rung (D = 64)                         30000x20    17776x24
  p. Triton base (this kernel)          424 (0.75)  414 (0.74)
  zz. gluon ws 192x128 -ml-pp           517 (0.93)  493 (0.92)
  -  zz on the persistent grid          510 (0.92)  486 (0.91)
The persistent grid moves ours by -1.7 .. +1.2 % at S >= 8K (FA4's own median moved by up to 3.5 % between blocks,
so pe's 0.93 at 8192x24 is mostly FA4's lower block): the per-tile cost that 8192x24 pays (ours 600 -> 645 TFLOP/s
from 64 to 384 key blocks per tile: ~6 blocks' time per tile, a + b n fits all four D = 128 shapes within 1 %)
is not the loads that the persistent grid hides. Goal 0.95 met on 3 of 7 shapes (16K, 32K, 48K at D = 128).
Session 10, call U10-3 (docs/lab-notebook.md; 2026-12-02, commit a2650cb, record data/h200x1/attention_vs_fa4_gluon_lp/,
``STUDY=gluon_lp scripts/attention_vs_fa4.sh``; another H200): the masked last key block peeled out of the ws
consumers' loop (``-lp``; -ml's in-loop branch is if-converted into 64 SEL + 34 ISETP per block, sm_90a SASS of
Triton 3.6: 587 -> 485 instructions per block), 8192x24 timed first and again last:
  rung (D = 128)                        8192x24 (first / last)  16384x24    32768x12    49152x12    32760x6
  h. Triton base (this kernel)          530 (0.78) / 520 (0.77)  528 (0.77)  528 (0.76)  536 (0.77)  507 (0.71)
  z. gluon ws -ml                       621 (0.94) / 620 (0.93)  641 (0.96)  643 (0.98)  647 (0.96)  621 (0.90)
  pe. z on the persistent grid          619 (0.92) / 583 (0.89)  633 (0.95)  640 (0.96)  642 (0.96)  614 (0.89)
  -  z with the last block peeled (-lp) 592 (0.88) / 595 (0.89)  633 (0.95)  644 (0.96)  647 (0.96)  585 (0.85)
  -  pe with the last block peeled      606 (0.91) / 603 (0.92)  631 (0.94)  638 (0.96)  648 (0.97)  615 (0.90)
  rung (D = 64)                         30000x20    17776x24
  p. Triton base (this kernel)          428 (0.75)  413 (0.74)
  zz. gluon ws 192x128 -ml-pp           521 (0.93)  506 (0.93)
  -  zz on the persistent grid          516 (0.92)  488 (0.94)
  -  zz with the last block peeled      514 (0.92)  488 (0.90)
  -  zz peeled, persistent (spills)     443 (0.78)  427 (0.77)
The peel is refuted as a lever: on the three masked shapes it is never faster (Wan -6 % one CTA per tile, +0 %
persistent; D = 64 -1 .. -4 %, -13 .. -14 % persistent: 120 B of stack), so the consumer loop is not issue-bound.
Where S % 128 == 0 the -lp kernel is the -ml kernel (SASS byte-identical, Triton 3.6.0 and its ptxas compiled on the
CPU machine), yet at 8192x24 it ran 4-5 % slower in its own block (0.94 -> 0.88 of FA4): the spread between
blocks of one binary at 8192x24 is as large as the gap to the goal, and 8192x24 stays under 0.95 in every block,
first or last (not the shape's position). Goal met on 3 of 7 shapes (16K, 32K, 48K at D = 128), as in session 9.
Session 25, calls N2 and N4 (docs/lab-notebook.md; 2026-12-05, **one H100 80GB HBM3**, the kind lent then; records
data/h100x1/attention_vs_fa4_gluon_nb/ and data/h100x1/attention_vs_fa4_gluon_rv/, ``MACHINE=h100x1
STUDY=gluon_nb|gluon_rv scripts/attention_vs_fa4.sh``). Two pieces of FA4's Hopper schedule were added to the ws kernel:
-nb puts the ping-pong's turns in hardware named barriers (``named_pp``), and -rv walks the key blocks last to first
(``reverse_kv``), so the masked block is outside the loop. Ours / FA4 in the same block, TFLOP/s of N4 (N2 for -nb):
  rung (D = 128)                        8192x24 (first / last)  16384x24    32768x12    49152x12    32760x6
  z. gluon ws -ml                       638 (0.94) / 656 (0.95)  670 (0.97)  657 (0.98)  664 (0.96)  646 (0.91)
  -  z, turns in mbarriers (-pp, N2)    671 (0.93) / 617 (0.92)  638 (0.92)  619 (0.93)  633 (0.91)  638 (0.90)
  -  z, turns in named barriers (N2)    626 (0.93) / 605 (0.94)  648 (0.96)  641 (0.97)  636 (0.93)  643 (0.91)
  rv. z, key blocks last to first       653 (0.96) / 609 (0.946)  672 (0.97)  648 (0.98)  660 (0.97)  685 (0.97)
  -  rv on the persistent grid          673 (0.95) / 662 (0.96)  672 (0.96)  647 (0.96)  655 (0.95)  656 (0.92)
  rung (D = 64)                         30000x20    17776x24
  zz. gluon ws 192x128 -ml-pp           543 (0.94)  471 (0.92)
  -  zz, turns in named barriers        542 (0.94)  473 (0.946)
  -  zz, key blocks last to first       544 (0.95)  474 (0.94)
  -  zz, named barriers and -rv         550 (0.96)  470 (0.94)
-rv is the lever for the masked shapes at D = 128: Wan +6.5 % over z in the same blocks. At D = 64 it gives -1 .. +2 %.
Named barriers recover most of what mbarrier turns lost, but turns are no faster than none at D = 128. Goal, by the
summary's rule (the fastest variant by time): met on 6 of 7 shapes on this H100, all but CogVideoX (0.941; 0.946 the
best rung). The sweep's tiles are now rv at D = 128 and zz with named barriers and -rv at D = 64
(``ulysses_gluon.SWEEP_CONFIGS``).
Session 26, calls N5 / N6 (2026-12-06, another H100 80GB HBM3; data/h100x1/attention_vs_fa4_gluon_jr/, ``MACHINE=h100x1
STUDY=gluon_jr scripts/attention_vs_fa4.sh``): -jr (``joint_release``, ``JOINT_RUNGS``) releases each ring slot once,
after the P V that read its V, with three slots. Each one-thread mbarrier arrive costs the consumer warpgroup a bar.sync
(Triton 3.6 SASS), and FA4 releases per warp without one; -jr removes one of each per consumer per block.
  rung                                  8192x24 (first / last)  16384x24    32768x12    49152x12    32760x6
  rv. (the sweep's tile, two slots)     641 (0.945) / 642 (0.94) 679 (0.97)  655 (0.945) 674 (0.97)  678 (0.96)
  -  rv, three slots                    683 (0.94) / 636 (0.94)  662 (0.95)  656 (0.98)  660 (0.955) 678 (0.96)
  -  rv, three slots, -jr               654 (0.94) / 663 (0.94)  680 (0.97)  648 (0.97)  657 (0.96)  682 (0.96)
  rung (D = 64)                         30000x20    17776x24
  zz with named barriers and -rv        551 (0.956) 490 (0.941)
  -  three slots                        554 (0.958) 474 (0.952)
  -  three slots, -jr                   547 (0.956) 476 (0.958)
-jr is not a lever: our TFLOP/s move by less than FA4's own median moves between blocks of one shape (up to 7.5 % at
8192x24: 678 / 729 / 693). The ratios rise on CogVideoX only because FA4 fell. Goal on this record by the summary's
rule (the fastest variant by time): 5 of 7, 8192x24 (0.937 / 0.936) and CogVideoX (0.941) missing; by the best ratio
only 8192x24 misses (0.945). The best-variant ratio moves +-1.5 % between records, so the goal sits inside the spread
on two shapes. With the fused epilogue, -jr's third slot at D = 128 passes the shared-memory limit (245 888 B); call
N5 found it, and it is now refused before launch (``GluonConfig.shared_bytes``).
Session 27, calls N7 / N8 (2026-12-06, another H100; data/h100x1/attention_vs_fa4_gluon_final/, ``MACHINE=h100x1
STUDY=gluon_final REPEATS=30 scripts/attention_vs_fa4.sh``): ``ulysses_gluon.FINAL_RUNGS`` side by side, 30 repeats.
  rung                                  8192x24 (first / last)  16384x24    32768x12    49152x12    32760x6
  rv. (the sweep's tile, two slots)     626 (0.943) / 623 (0.943) 647 (0.97) 659 (0.97) 665 (0.97) 679 (0.97)
  -  rv, persistent                     621 (0.954) / 607 (0.934) 649 (0.96) 645 (0.96) 663 (0.965) 630 (0.91)
  -  rv, three slots, -jr               618 (0.943) / 612 (0.928) 657 (0.97) 660 (0.97) 662 (0.97) 668 (0.954)
  rung (D = 64)                         30000x20    17776x24
  zz with named barriers and -rv        543 (0.953) 531 (0.943)
  -  without -rv                        538 (0.940) 527 (0.939)
  -  three slots, -jr                   541 (0.950) 526 (0.942)
  -  three slots, -jr, persistent       543 (0.959) 535 (0.959)
Goal by the summary's rule: 6 of 7; 8192x24 (0.943, both blocks) the one short. CogVideoX is met by the persistent
three-slot -jr tile, our TFLOP/s up 0.8 % with FA4 flat.
Session 27, calls N10 / N14 (two more H100s): the same rungs gave 3 of 7 and 2 of 7 (8192x24 0.90). Every record so
far started each sample's clock on an idle GPU, so a sample held the host's work to launch its first kernel: ours
(Python launcher, four TMA descriptors per call) ~100-250 us more than FA4's. Queued behind a GPU-side wait
(``bench.time_ms(lead=True)``, data/h100x1/attention_vs_fa4_gluon_final_q/, the card that gave 2 of 7 minutes before):
  rung                                  8192x24 (first / last)  16384x24    32768x12    49152x12    32760x6
  rv. (the sweep's tile, two slots)     720 (0.977) / 719 (0.977) 684 (0.977) 685 (0.989) 675 (0.973) 708 (0.975)
  rung (D = 64)                         30000x20    17776x24
  zz with named barriers and -rv        556 (0.963) 569 (0.962)
Goal met on 7 of 7 in GPU time. Sustained at the 700 W cap (data/h100x1/attention_clocks/, a third card): 0.967 at
8192x24 and 32768x12, 0.971 on CogVideoX, ours at FA4's SM clock at D = 128.

A separate one-program kernel (``sync.epoch_barrier_kernel``) ends the fused layer: each rank releases its epoch
into every peer's flag slot (system scope) and waits (acquire, bounded) for every peer's, so "output complete
everywhere" has a time and a failure to arrive has a report instead of a hang.

Legend: S = sequence length (all of it), P = ranks, H = heads of the layer, Hl = H / P heads per rank,
Hc = heads of one launch (Hl, or a chunk of them), D = head dim (64 or 128), Sl = S / P sequence rows per rank,
BM / BN = query / key rows per block.

Layouts (row-major, contiguous, element strides):
  q, k, v    [S, Hl, D]  this rank's heads over the full sequence (after the pre-attention all-to-all)
  out local  [S, Hc, D]  FUSED=False: heads h_start .. h_start + Hc of this rank
  out[r]     [Sl, H, D]  FUSED=True: rank r's symmetric output; this rank's head h lands at global head
                         rank * Hl + h; rank r owns sequence rows [r * Sl, (r + 1) * Sl)
  out_table  [P] int64   every rank's out base address, valid in this process (peer pointers)
  Kd, Vd     TMA only: host tensor descriptors over k, v viewed [S, Hl*D] (block [BN, D], the head at column
             h*D); Hopper's bulk tensor loads replace per-thread pointer loads (fewer registers and address
             instructions in the inner loop). Same arithmetic either way.
  ts         [n_programs, 2] int64 global-timer ns (program start, after its last store), TIMED only
Every program handles one (query block, head): program (m, h) has linear id h * cdiv(S, BM) + m, so
consecutive programs share a head and its K/V stay in L2. PERSISTENT: a 1-D grid of min(tiles, SMs) programs;
program p handles tiles p, p + grid, ... (tile t = that linear id), same tile body; ``ts`` is indexed by tile.

Under Triton's interpreter (``DEVICE=False``) there are no timers (timestamps are 0) and no fences; the data
path is the same. bf16 ``tl.dot`` is wrong in the interpreter: test there in fp16 or fp32.
"""
import triton
import triton.language as tl

from .sync import globaltimer

LOG2E = 1.4426950408889634  # softmax(x) = exp2(x * log2(e) - max): the launcher folds log2(e) into the scale


@triton.jit
def _scores(q, K, Kd, col, start_n, S, row_stride, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            MASK_N: tl.constexpr, TMA: tl.constexpr):
    """q K^T of one key block: [BM, BN] fp32 (unscaled; keys past S score -inf when MASK_N). TMA: the K block
    comes through the tensor descriptor Kd over [S, Hl*D] at column ``col`` (rows past S read as 0); otherwise
    through the pointer K (this head's first element)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)                           # [BN] key rows
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    key_ok = offs_n < S
    if TMA:
        k = Kd.load([start_n, col])                                    # [BN, D]
    else:
        kv = offs_n[:, None] * row_stride + offs_d[None, :]            # [BN, D] element offsets from this head
        if MASK_N:  # the last, partial key block (S % BN != 0): missing keys load 0 and score -inf
            k = tl.load(K + kv, mask=key_ok[:, None], other=0.0)      # [BN, D]
        else:
            k = tl.load(K + kv)
    qk = tl.dot(q, tl.trans(k))                                        # [BM, BN] fp32
    if MASK_N:
        qk = tl.where(key_ok[None, :], qk, float("-inf"))
    return qk


@triton.jit
def _online_softmax(acc, l_i, m_i, qk, qk_scale, SCALE_Q: tl.constexpr):
    """One key block's step of the online softmax (base 2): the block's probabilities p [BM, BN], the rescaled
    acc [BM, D] and row sums l_i [BM], the new running max [BM]. SCALE_Q: the scores are already scaled."""
    if SCALE_Q:
        m_new = tl.maximum(m_i, tl.max(qk, 1))                         # [BM]
        p = tl.math.exp2(qk - m_new[:, None])                          # [BM, BN]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)              # [BM]
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])               # [BM, BN]
    alpha = tl.math.exp2(m_i - m_new)                                  # [BM] rescale of what came before
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, acc, l_i, m_new


@triton.jit
def _softmax_pv(acc, l_i, m_i, qk, V, Vd, col, start_n, S, row_stride, qk_scale, HEAD_DIM: tl.constexpr,
                BLOCK_N: tl.constexpr, MASK_N: tl.constexpr, TMA: tl.constexpr, SCALE_Q: tl.constexpr):
    """The online softmax of one key block's scores ``qk`` [BM, BN], then P V into acc[BM, D]: l_i[BM] (row
    sums), m_i[BM] (running max, base 2). SCALE_Q: the scores are already scaled (q was multiplied by
    ``qk_scale``), so no multiply here."""
    offs_n = start_n + tl.arange(0, BLOCK_N)                           # [BN]
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    p, acc, l_i, m_new = _online_softmax(acc, l_i, m_i, qk, qk_scale, SCALE_Q)
    if TMA:
        v = Vd.load([start_n, col])                                    # [BN, D]
    else:
        kv = offs_n[:, None] * row_stride + offs_d[None, :]
        if MASK_N:
            v = tl.load(V + kv, mask=(offs_n < S)[:, None], other=0.0)
        else:
            v = tl.load(V + kv)
    acc = tl.dot(p.to(v.dtype), v, acc)                                # [BM, D] fp32
    return acc, l_i, m_new


@triton.jit
def _attend_block(acc, l_i, m_i, q, K, V, Kd, Vd, col, start_n, S, row_stride, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK_N: tl.constexpr, TMA: tl.constexpr,
                  SCALE_Q: tl.constexpr):
    """One key block of the online softmax: acc[BM, D], l_i[BM] (row sums), m_i[BM] (running max, base 2).
    TMA: K/V blocks come through tensor descriptors Kd/Vd over [S, Hl*D] at column ``col`` (rows past S read
    as 0); otherwise through pointers K/V (this head's first element). K and V are both loaded before the
    scores (the order the software pipeliner is given: round 3's first call, with V loaded after the softmax,
    ran the base rung 14-20 % slower; docs/lab-notebook.md, "Ulysses round 3"). SCALE_Q: the scores are already scaled."""
    offs_n = start_n + tl.arange(0, BLOCK_N)                           # [BN] key rows
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    key_ok = offs_n < S
    if TMA:
        k = Kd.load([start_n, col])                                    # [BN, D]
        v = Vd.load([start_n, col])
    else:
        kv = offs_n[:, None] * row_stride + offs_d[None, :]            # [BN, D] element offsets from this head
        if MASK_N:  # the last, partial key block (S % BN != 0): missing keys load 0 and score -inf
            k = tl.load(K + kv, mask=key_ok[:, None], other=0.0)      # [BN, D]
            v = tl.load(V + kv, mask=key_ok[:, None], other=0.0)      # [BN, D]
        else:
            k = tl.load(K + kv)
            v = tl.load(V + kv)
    qk = tl.dot(q, tl.trans(k))                                        # [BM, BN] fp32
    if MASK_N:
        qk = tl.where(key_ok[None, :], qk, float("-inf"))
    p, acc, l_i, m_new = _online_softmax(acc, l_i, m_i, qk, qk_scale, SCALE_Q)
    acc = tl.dot(p.to(v.dtype), v, acc)                                # [BM, D] fp32
    return acc, l_i, m_new


@triton.jit
def _tile(Q, K_h, V_h, Kd, Vd, out_ptr, out_table, ts_ptr, pid_m, pid_h, tile_id, S, rows_per_rank, in_row_stride,
          out_row_stride, h, out_head0, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, FUSED: tl.constexpr, TIMED: tl.constexpr,
          DEVICE: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, PIPE: tl.constexpr, SCALE_Q: tl.constexpr):
    """One output tile [BLOCK_M query rows of head h]: the online softmax over every key block, then the
    epilogue (this rank's layout, or row by row to the owner ranks); ``tile_id`` indexes the timestamps."""
    if TIMED:
        t_start = globaltimer(DEVICE)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                   # [BM] query rows
    offs_d = tl.arange(0, HEAD_DIM)                                    # [D]
    row_ok = offs_m < S                                                # [BM]
    head_off = h * HEAD_DIM
    q = tl.load(Q + head_off + offs_m[:, None] * in_row_stride + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)                       # [BM, D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)                # [BM]
    l_i = tl.zeros([BLOCK_M], tl.float32)                              # [BM]
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)                    # [BM, D]
    if SCALE_Q:  # the softmax scale folded into q once per tile (bf16: q * scale rounded; ~2^-9 relative)
        q = (q.to(tl.float32) * qk_scale).to(Q.dtype.element_ty)
    n_full = S - S % BLOCK_N
    if PIPE:
        # software-pipelined key loop (FA3's intra-warpgroup overlap written in the source): the scores of key
        # block j + 1 are issued before block j's softmax, so the tensor cores compute q K_{j+1}^T while the
        # softmax of block j runs; same arithmetic per block, so the same bits as without it
        if n_full > 0:
            qk = _scores(q, K_h, Kd, head_off, 0, S, in_row_stride, HEAD_DIM, BLOCK_N, False, TMA)
            for start_n in tl.range(BLOCK_N, n_full, BLOCK_N, warp_specialize=WS):
                qk_next = _scores(q, K_h, Kd, head_off, start_n, S, in_row_stride, HEAD_DIM, BLOCK_N, False, TMA)
                acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, qk, V_h, Vd, head_off, start_n - BLOCK_N, S,
                                            in_row_stride, qk_scale, HEAD_DIM, BLOCK_N, False, TMA, SCALE_Q)
                qk = qk_next
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, qk, V_h, Vd, head_off, n_full - BLOCK_N, S, in_row_stride,
                                        qk_scale, HEAD_DIM, BLOCK_N, False, TMA, SCALE_Q)
    else:
        # WS: Triton's warp specialisation of the key loop (loads in a producer partition, the MMAs and the
        # softmax in consumer partitions); same arithmetic, so the same bits as without it
        for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=WS):
            acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, K_h, V_h, Kd, Vd, head_off, start_n, S, in_row_stride,
                                          qk_scale, HEAD_DIM, BLOCK_N, False, TMA, SCALE_Q)
    if not EVEN_N:
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, K_h, V_h, Kd, Vd, head_off, n_full, S, in_row_stride,
                                      qk_scale, HEAD_DIM, BLOCK_N, True, TMA, SCALE_Q)
    o = (acc / l_i[:, None]).to(Q.dtype.element_ty)                    # [BM, D]
    col = (out_head0 + pid_h) * HEAD_DIM                               # output head's first element in a row
    if FUSED:
        # Route row by row: owner rank and its local row; a tile straddling two ranks splits here.
        dest = offs_m // rows_per_rank                                 # [BM] owner rank
        local_row = offs_m - dest * rows_per_rank                      # [BM] row in the owner's out[Sl, H, D]
        base = tl.load(out_table + dest, mask=row_ok, other=0)         # [BM] int64 owner's base address
        base = base.to(tl.pointer_type(Q.dtype.element_ty))            # [BM] peer pointers
        base = tl.multiple_of(base, 16)  # symmetric buffers are >= 16 B aligned: 16-byte stores (on the pointer,
        #                                  not the int64: the hint does not survive the int -> pointer cast)
        row_ptr = base + local_row * out_row_stride + col              # [BM] row starts in the owners' out
        tl.store(row_ptr[:, None] + offs_d[None, :], o, mask=row_ok[:, None])
    else:
        tl.store(out_ptr + offs_m[:, None] * out_row_stride + col + offs_d[None, :], o, mask=row_ok[:, None])
    if TIMED:
        tl.debug_barrier()                                             # every warp has issued its stores
        t_end = globaltimer(DEVICE)
        tl.store(ts_ptr + tile_id * 2, t_start)
        tl.store(ts_ptr + tile_id * 2 + 1, t_end)


@triton.jit
def ulysses_attention_kernel(
    Q, K, V,               # *T [S, Hl, D]
    Kd, Vd,                # TMA: tensor descriptors over K, V viewed [S, Hl*D], block [BLOCK_N, D]; else None
    out_ptr,               # FUSED=False: *T [S, Hc, D] (this launch's heads); FUSED=True: unused (pass q)
    out_table,             # *int64 [P]: every rank's out[Sl, H, D] base address (FUSED); unused otherwise
    ts_ptr,                # *int64 [n_tiles, 2] global timer ns: tile start, after its last store (TIMED)
    S,                     # sequence length
    rows_per_rank,         # Sl = S / P (FUSED)
    in_row_stride,         # Hl * D: elements between consecutive sequence rows of q, k, v
    out_row_stride,        # Hc * D (plain) or H * D (fused)
    h_start,               # this launch's first head within the rank's Hl (grid axis 1 covers Hc heads)
    out_head0,             # output head of this launch's first head: 0 (plain), rank * Hl + h_start (fused)
    qk_scale,              # sm_scale * log2(e)
    n_heads,               # Hc: heads of this launch (PERSISTENT: the tile count is cdiv(S, BM) * Hc)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,  # S % BLOCK_N == 0: no key masking at all
    FUSED: tl.constexpr,   # epilogue stores each row into its owner rank's buffer (peer pointers)
    TIMED: tl.constexpr,   # record the tile's start and last-store times
    DEVICE: tl.constexpr,  # real GPU (timers are inline PTX); False under the interpreter
    TMA: tl.constexpr = False,  # K/V through tensor descriptors (Hopper TMA loads) instead of pointers
    WS: tl.constexpr = False,   # warp-specialised key loop (tl.range(..., warp_specialize=True))
    PERSISTENT: tl.constexpr = False,  # a 1-D grid of <= SMs programs, each looping over tiles t = pid, pid + grid..
    PIPE: tl.constexpr = False,        # software-pipelined key loop: block j+1's q K^T issued before block j's softmax
    SCALE_Q: tl.constexpr = False,     # the softmax scale (times log2 e) folded into q once per tile
):
    n_m = tl.cdiv(S, BLOCK_M)
    if PERSISTENT:
        for t in tl.range(tl.program_id(0), n_m * n_heads, tl.num_programs(0)):
            pid_h = t // n_m
            pid_m = t - pid_h * n_m
            h = h_start + pid_h
            _tile(Q, K + h * HEAD_DIM, V + h * HEAD_DIM, Kd, Vd, out_ptr, out_table, ts_ptr, pid_m, pid_h, t, S,
                  rows_per_rank, in_row_stride, out_row_stride, h, out_head0, qk_scale, HEAD_DIM, BLOCK_M,
                  BLOCK_N, EVEN_N, FUSED, TIMED, DEVICE, TMA, WS, PIPE, SCALE_Q)
    else:
        pid_m = tl.program_id(0)
        pid_h = tl.program_id(1)
        h = h_start + pid_h
        _tile(Q, K + h * HEAD_DIM, V + h * HEAD_DIM, Kd, Vd, out_ptr, out_table, ts_ptr, pid_m, pid_h,
              pid_h * n_m + pid_m, S, rows_per_rank, in_row_stride, out_row_stride, h, out_head0, qk_scale,
              HEAD_DIM, BLOCK_M, BLOCK_N, EVEN_N, FUSED, TIMED, DEVICE, TMA, WS, PIPE, SCALE_Q)
