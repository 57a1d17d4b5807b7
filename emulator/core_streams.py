"""The jitted core's shared vocabulary (emulator/core.py executes with it): its hazard kinds,
order reasons, SRAM row flags, units and counters, and the stream-ring helpers every unit's
execution uses (reading and writing a stream value, unread values, the MXM's order hazards,
operand errors, plain copy loops). No state: arrays in, arrays out."""
from numba import njit

from lpu.emulator.arith import CORE_OPS

C_READ_REF = len(CORE_OPS)   # a READ that puts a reference to its SRAM row on the stream (prepare.by_reference)

TRANSPOSE_BUFFERS = 4

# hazard kinds (messages in run.py)
(H_NONE, H_STREAM_EMPTY, H_TWO_WRITERS, H_BANK, H_ADDR, H_BUSY, H_NOT_READY, H_DTYPE, H_OPERAND, H_SRAM_EMPTY,
 H_UNREAD, H_INSTALL, H_ORDER, H_SRAM_CLOBBERED) = range(14)
# H_ORDER reasons (x0; x1 the plane, x2 the row): the MXM's weight-buffer and accumulator protocol,
# as the checker (compiler/verify_units.py, mxm-order) states it
(ORD_RELOAD, ORD_STALE, ORD_RESET_UNREAD, ORD_ACCUM_READ, ORD_ACC_EMPTY, ORD_NOT_INSTALLED,
 ORD_NEVER_READ) = range(7)
# SRAM row flags (`valid`): 0 no value, 1 a value, RO_LOADED a loaded input, weight or constant,
# RO_CLOBBERED such a row overwritten (reading it again is a hazard: the tensor is still live)
RO_LOADED, RO_CLOBBERED = 2, 3
H_FLUSH = 99      # not a hazard: the host is asked to multiply out a plane's batch (see mxm.flush)
H_C2C = 98        # not a hazard: a chip-to-chip instruction, which the host runs (emulator/c2c.py)

# the core's units (emulator/prepare.py maps the opcode table's unit of every opcode onto these)
# and the unit each core operation runs on: an opcode reaches a core operation only if the
# table puts it on the same unit
U_MEM, U_VXM, U_MXM, U_SXM, U_C2C = range(5)
UNIT_CODE = {"mem": U_MEM, "vxm": U_VXM, "mxm": U_MXM, "sxm": U_SXM, "c2c": U_C2C}
_UNIT_OPS = {U_MEM: ("READ", "WRITE", "GATHER", "SCATTER"), U_MXM: ("LW", "IW", "ABC", "ACC"),
             U_SXM: ("SHIFT", "ROTATE", "PERMUTE", "DISTRIBUTE", "TPIN", "TPOUT"), U_C2C: ("SEND", "RECV")}
CORE_UNIT_OF = {name: next((u for u, names in _UNIT_OPS.items() if name in names), U_VXM) for name in CORE_OPS}

# counters
K_BANK_ACCESSES, K_VXM_BUSY, K_MXM_BUSY, K_SXM_BUSY, K_MACS, K_SRAM_READ, K_SRAM_WRITTEN = range(7)
N_COUNTERS = 7

# A stream ring slot is two int64 words (emulator/core.py `workspace`): its tag, the diagonal k it
# holds, the writer's position and whether anyone read it, (k << TAG_SHIFT) | (pos << 1) | read
# (EMPTY_TAG: never written); and its reference, (writer's execution index << REF_SHIFT) |
# (SRAM row + 1) (0: the payload is in ring_pay). One load answers a read's check, one line a
# slot's fields (five int64 arrays before: k, pos, src, read flag, row).
TAG_SHIFT = 16
TAG_POS = (1 << (TAG_SHIFT - 1)) - 1     # positions < 2^15 (core.pack_meta holds them in 12 bits)
EMPTY_TAG = -(1 << 62)                   # its k (EMPTY_TAG >> TAG_SHIFT) is no diagonal of a run
REF_SHIFT = 32
REF_ROW = (1 << REF_SHIFT) - 1           # SRAM rows + 1 < 2^32, execution indices < 2^31


@njit(cache=True, inline="always")
def copy_run(x, y):
    for l in range(y.shape[0]):
        y[l] = x[l]


@njit(cache=True, inline="always")
def zero_run(y):
    for l in range(y.shape[0]):
        y[l] = 0


@njit(cache=True, inline="always")
def ref_ok(ref, w, spd):
    d = (ref >> 6) & 3
    s = ref & 63
    return ref >= 0 and d <= 1 and s + w <= spd


@njit(cache=True, inline="always")
def diagonal(ref, q, c, size):
    """(direction, first stream, diagonal, ring slot) of stream operand ref at position q in
    cycle c, for rings of `size` slots (a power of two): a vector moves one position a cycle, so
    its diagonal c -+ q is the same at every position it passes."""
    d = (ref >> 6) & 3
    k = c - q if d == 0 else c + q
    return d, ref & 63, k, k & (size - 1)


@njit(cache=True, inline="always")
def stream_take(ref, w, q, c, ring, hz):
    """Read w byte planes of ref at position q in cycle c without copying them: the checks and
    read marks of `stream_read`; the ring slot (its planes then `stream_plane`), -1 on a hazard."""
    ring_tag = ring[0]
    d, s, k, slot = diagonal(ref, q, c, ring_tag.shape[2])
    for b in range(w):
        tag = ring_tag[d, s + b, slot]
        wpos = (tag >> 1) & TAG_POS
        if tag >> TAG_SHIFT != k or (d == 0 and wpos > q) or (d == 1 and wpos < q):
            hz[0] = H_STREAM_EMPTY
            hz[3] = d
            hz[4] = s + b
            hz[5] = k
            hz[6] = wpos if tag >> TAG_SHIFT == k else -1
            return -1
    for b in range(w):
        ring_tag[d, s + b, slot] |= 1
    return slot


@njit(cache=True, inline="always")
def stream_plane(ring, ref, b, slot):
    """Byte plane b of the value in ring slot `slot` of ref (from `stream_take`): its payload,
    or the SRAM row it refers to."""
    _, ring_ref, ring_pay, mem = ring
    d, s = (ref >> 6) & 3, (ref & 63) + b
    row = (ring_ref[d, s, slot] & REF_ROW) - 1
    return ring_pay[d, s, slot] if row < 0 else mem[row]


@njit(cache=True, inline="always")
def stream_planes(ring, ref, w, slot):
    """The four byte planes of a value of w planes (`stream_plane`; the planes past w repeat the
    last: never read), a tuple for emulator/vxm_fast.py."""
    return (stream_plane(ring, ref, 0, slot), stream_plane(ring, ref, min(1, w - 1), slot),
            stream_plane(ring, ref, min(2, w - 1), slot), stream_plane(ring, ref, min(3, w - 1), slot))


@njit(cache=True, inline="always")
def stream_read(ref, w, q, c, ring, dst, hz):
    """Read w byte planes of ref at position q in cycle c into dst; False on a hazard."""
    slot = stream_take(ref, w, q, c, ring, hz)
    if slot < 0:
        return False
    for b in range(w):
        copy_run(stream_plane(ring, ref, b, slot), dst[b])
    return True


@njit(cache=True, inline="always")
def stream_claim(ref, w, p, c, ex, ring, hz, row=-1):
    """Take the ring slot of w byte planes of ref at position p in cycle c for writer ex (the
    checks and fields of `stream_write`): the slot, whose payload planes
    ring_pay[d, s + b, slot] the writer then fills, or -1 on a hazard."""
    ring_tag, ring_ref = ring[0], ring[1]
    d, s, k, slot = diagonal(ref, p, c, ring_tag.shape[2])
    for b in range(w):
        tag = ring_tag[d, s + b, slot]
        old = tag >> TAG_SHIFT
        if old == k or (tag != EMPTY_TAG and tag & 1 == 0):   # written twice, or never read
            hz[0], hz[3], hz[4], hz[5], hz[6] = H_TWO_WRITERS if old == k else H_UNREAD, d, s + b, old, \
                ring_ref[d, s + b, slot] >> REF_SHIFT
            return -1
    for b in range(w):
        ring_tag[d, s + b, slot] = (k << TAG_SHIFT) | (p << 1)
        ring_ref[d, s + b, slot] = (ex << REF_SHIFT) | (row + 1)
    return slot


@njit(cache=True, inline="always")
def slot_plane(ring, ref, b, slot):
    """Payload plane b of ring slot `slot` of ref (a writer's, after `stream_claim`)."""
    return ring[2][(ref >> 6) & 3, (ref & 63) + b, slot]


@njit(cache=True, inline="always")
def stream_slot_planes(ring, ref, w, slot):
    """The four payload planes of a writer's slot (`slot_plane`; past w the last repeats, never
    written), a tuple for emulator/vxm_fast.py."""
    return (slot_plane(ring, ref, 0, slot), slot_plane(ring, ref, min(1, w - 1), slot),
            slot_plane(ring, ref, min(2, w - 1), slot), slot_plane(ring, ref, min(3, w - 1), slot))


@njit(cache=True, inline="always")
def stream_write(ref, w, p, c, ex, ring, src, hz, row=-1):
    """Put w byte planes of src on ref at position p in cycle c (writer execution index ex);
    or (w = 1, row >= 0) a reference to SRAM row `row` of `mem`, which every reader copies
    (a READ whose row nothing can change while its value is on the stream: C_READ_REF)."""
    slot = stream_claim(ref, w, p, c, ex, ring, hz, row)
    if slot < 0:
        return False
    if row < 0:
        for b in range(w):
            copy_run(src[b], slot_plane(ring, ref, b, slot))
    return True


@njit(cache=True)
def first_unread(ring, hz):
    """At the end of the run: the earliest-written value still unread, as an H_UNREAD hazard."""
    ring_tag, ring_ref = ring[0], ring[1]
    best = -1
    for d in range(ring_tag.shape[0]):
        for s in range(ring_tag.shape[1]):
            for slot in range(ring_tag.shape[2]):
                tag, src = ring_tag[d, s, slot], ring_ref[d, s, slot] >> REF_SHIFT
                if tag != EMPTY_TAG and tag & 1 == 0 and (best < 0 or src < best):
                    best = src
                    hz[0], hz[3], hz[4], hz[5], hz[6] = H_UNREAD, d, s, tag >> TAG_SHIFT, best
    return best < 0


@njit(cache=True)
def order_hazard(hz, reason, plane, row):
    hz[0], hz[3], hz[4], hz[5] = H_ORDER, reason, plane, row
    return False


@njit(cache=True)
def order_done(order, hz):
    """At the end of the run: a weight row loaded but never installed, or an accumulator result
    never read out (the earliest such instruction), as an H_ORDER hazard."""
    lw_src, acc_state, acc_last = order
    best = -1
    for pl in range(lw_src.shape[0]):
        for r in range(lw_src.shape[1]):
            if lw_src[pl, r] >= 0 and (best < 0 or lw_src[pl, r] < best):
                best = lw_src[pl, r]
                hz[0], hz[3], hz[4], hz[5], hz[6] = H_ORDER, ORD_NOT_INSTALLED, pl, r, best
        for r in range(acc_state.shape[1]):
            if acc_state[pl, r] == 1 and (best < 0 or acc_last[pl, r] < best):
                best = acc_last[pl, r]
                hz[0], hz[3], hz[4], hz[5], hz[6] = H_ORDER, ORD_NEVER_READ, pl, r, best
    return best < 0


@njit(cache=True, inline="always")
def operand_error(hz, field, value):
    hz[0] = H_OPERAND
    hz[3] = field
    hz[4] = value
    return False
