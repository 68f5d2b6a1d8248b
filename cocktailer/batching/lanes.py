"""Values across many instances ("lanes") and each data op's batching rule.

A batched run executes one op for all the lanes that reach it: the instances of a batch, or the
recursive calls of one level of their trees. A value is either the same in every lane (a plain
tensor: weights, constants, what is computed from them alone) or a `Lanes`: one row per lane.
A `Lanes` may read its rows through an index array instead of holding them (ACROBAT's gather
fusion, §5.2): restricting a value to the lanes that take a branch, or handing each recursive
call its instance's node table, costs an index, not a copy; a SELECT with a per-lane index reads
the table through both indices in one gather.

A rule computes, for the lanes' rows, what SEMANTICS computes for one lane. Where no rule is
written, `torch.vmap` of the op's meaning is: correct for every op, slower for the common ones.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from cocktailer.ir import ELEMENTWISE, SEMANTICS, Op, Operation


# An executor's env maps value ids to values, and these keys to what a region needs beside them:
# the call ids of the lanes (level mode); the self-call handler; each lane's sizes that differ
# between instances (one column per ragged size); the ops whose per-lane indices an inspector
# already checked against those sizes (level mode); what notes the arm each call takes at each
# branch (the torch inspector).
LANE, CALLS, SIZES, CHECKED, ARMS = "lane", "calls", "sizes", "checked", "arms"
HIDDEN = (LANE, CALLS, SIZES, CHECKED, ARMS)
SHARED_BY_LANES = (CALLS, ARMS)   # hidden keys that are handlers, not values with a row per lane


class Lanes:
    """A value with one row per lane: lane i holds base[i], or base[index[i]] when index is set."""
    __slots__ = ("base", "index")

    def __init__(self, base: torch.Tensor, index: torch.Tensor | None = None):
        self.base, self.index = base, index

    @property
    def count(self) -> int:
        return len(self.index) if self.index is not None else self.base.shape[0]

    @property
    def rank(self) -> int:
        """The rank of one lane's value."""
        return self.base.dim() - 1

    def rows(self) -> torch.Tensor:
        return self.base if self.index is None else self.base.index_select(0, self.index)

    def take(self, lanes: torch.Tensor) -> "Lanes":
        """The lanes `lanes` (indices into this value's lanes), without copying rows."""
        return Lanes(self.base, lanes if self.index is None else self.index.index_select(0, lanes))

    def __repr__(self) -> str:
        return f"Lanes({tuple(self.base.shape)}, index={None if self.index is None else len(self.index)})"


class RowLayout:
    """Where each lane's rows lie when the rows of a ragged dim (a sentence's tokens) of every
    lane are held one after another, packed: lane i's are rows offsets[i] .. offsets[i] +
    lengths[i]; padded, every lane has `width` rows (the batch's largest size)."""

    def __init__(self, lengths: torch.Tensor, width: int):
        self.lengths, self.width = lengths, width
        self.offsets = torch.cumsum(lengths, 0) - lengths
        self.total = int(lengths.sum())
        self.shortest = int(lengths.min()) if len(lengths) else width   # (no lane: no index is out of range)
        self.full = self.total == self.count * width   # every lane at the width: packed is padded
        self._slots = self._pad_index = None

    @property
    def count(self) -> int:
        return len(self.lengths)

    def same(self, other: "RowLayout") -> bool:
        return self is other or (self.width == other.width and self.total == other.total
                                 and torch.equal(self.lengths, other.lengths))

    def lane_rows(self, lanes: torch.Tensor) -> torch.Tensor:
        """The packed rows of `lanes`, lane after lane. (In numpy, as `pad_index_of`: an early
        exit takes the rows of the lanes still running for every value it hands on, at every
        layer; five torch ops on a few dozen lanes took 70-77 us a call, numpy's 16-18.)"""
        picked = lanes.cpu().numpy()
        lengths, offsets = self.lengths.numpy()[picked], self.offsets.numpy()[picked]
        starts = np.repeat(offsets - (np.cumsum(lengths) - lengths), lengths)
        return torch.from_numpy(starts + np.arange(len(starts)))

    @property
    def slots(self) -> torch.Tensor:
        """Each packed row's position in the padded rows, (lanes * width) flattened (in numpy,
        as `lane_rows`)."""
        if self._slots is None:
            lane = np.repeat(np.arange(self.count), self.lengths.numpy())
            self._slots = torch.from_numpy(lane * self.width + np.arange(self.total) - self.offsets.numpy()[lane])
        return self._slots

    @property
    def pad_index(self) -> torch.Tensor:
        """Each padded position's packed row (`pad_index_of` every lane at the width)."""
        if self._pad_index is None:
            self._pad_index = torch.from_numpy(self.pad_index_of(None, self.width))
        return self._pad_index

    def pad_index_of(self, lanes: np.ndarray | None, width: int) -> np.ndarray:
        """Each position's packed row, for `lanes` (all where None) padded to `width`: a lane's
        own, its last one repeated past its size (padding holds values the program has, as the
        stacked inputs' does: no division by a zero nobody wrote), and a lane without rows
        reads row 0. In numpy: a few dozen lanes' index arithmetic costs more in torch ops'
        overhead than in work."""
        offsets, lengths = self.offsets.numpy(), self.lengths.numpy()
        if lanes is not None:
            offsets, lengths = offsets[lanes], lengths[lanes]
        last = np.maximum(lengths - 1, 0)
        index = offsets[:, None] + np.minimum(np.arange(width)[None, :], last[:, None])
        return np.minimum(index.ravel(), max(self.total - 1, 0))

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """Rows (lanes, width, ...) of a padded value -> its packed rows (total, ...)."""
        if self.full:
            return padded.reshape(self.total, *padded.shape[2:])
        return padded.reshape(self.count * self.width, *padded.shape[2:]).index_select(0, self.slots)


class HeldApart(Lanes):
    """A lane value held other than as one tensor of rows: `base` puts every lane's rows
    together (once, when a reader needs them), with no index array over them."""
    __slots__ = ()

    @property
    def index(self):
        return None

    def rows(self) -> torch.Tensor:
        return self.base


class Packed(HeldApart):
    """A value whose first dim is ragged, held as its real rows only (`RowLayout`): native blocks
    of position-wise ops (a Linear, a LayerNorm over each token) compute on these, so that no
    work is spent on padding. Read as a `Lanes` (`rows()`, `base`), it is padded, once."""
    __slots__ = ("packed", "layout", "_padded", "_pad_into")

    def __init__(self, packed: torch.Tensor, layout: RowLayout, pad_into: Callable[[], torch.Tensor] | None = None):
        """`pad_into`: gives memory for the padded rows, (count * width, ...), if they are
        needed (else fresh memory)."""
        self.packed, self.layout, self._padded, self._pad_into = packed, layout, None, pad_into

    @property
    def base(self) -> torch.Tensor:
        if self._padded is None:
            layout, rest = self.layout, self.packed.shape[1:]
            if layout.full:
                self._padded = self.packed.view(layout.count, layout.width, *rest)
            elif layout.total == 0:
                self._padded = self.packed.new_zeros((layout.count, layout.width, *rest))
            else:
                padded = torch.index_select(self.packed, 0, layout.pad_index, out=self._pad_into()) \
                    if self._pad_into is not None else self.packed.index_select(0, layout.pad_index)
                self._padded = padded.view(layout.count, layout.width, *rest)
        return self._padded

    @property
    def count(self) -> int:
        return self.layout.count

    @property
    def rank(self) -> int:
        return self.packed.dim()

    def take(self, lanes: torch.Tensor) -> "Packed":
        return Packed(self.packed.index_select(0, self.layout.lane_rows(lanes)),
                      RowLayout(self.layout.lengths[lanes], self.layout.width))

    def first_rows(self, k: int) -> torch.Tensor:
        """Row k of every lane."""
        if k >= self.layout.shortest:
            raise IndexError(f"index {k} is out of bounds for dimension 0 with size {self.layout.shortest}")
        return self.packed.index_select(0, self.layout.offsets + k)

    def __repr__(self) -> str:
        return f"Packed({tuple(self.packed.shape)}, lanes={self.count})"


class Split(HeldApart):
    """A branch's result whose arms ran on disjoint lanes, kept as the arms' values until a
    reader needs every lane's row (`base`: then they are written into one tensor, once).

    Code after a branch often reads its results only on the lanes of one arm: an early exit
    unrolled from a loop is a chain of branches, each running the next layer on the lanes that
    have not left and passing the hidden state on, with a placeholder for the lanes that left.
    Taking those lanes from the arm's own value costs one gather of their rows; putting every
    arm's rows into one tensor first and taking them out again cost three copies of the whole
    state per layer (Berxit: padding, scattering, packing)."""
    __slots__ = ("parts", "lanes_count", "dtype", "_rank", "_base")

    def __init__(self, parts: list[tuple[torch.Tensor, object]], count: int, dtype: torch.dtype):
        self.parts, self.lanes_count, self.dtype, self._base = parts, count, dtype, None
        value = parts[0][1]
        self._rank = value.rank if isinstance(value, Lanes) else value.dim()

    @property
    def base(self) -> torch.Tensor:
        if self._base is None:
            first = self.parts[0][1]
            shape = first.base.shape[1:] if isinstance(first, Lanes) else first.shape
            device = (first.base if isinstance(first, Lanes) else first).device
            self._base = torch.empty((self.lanes_count, *shape), dtype=self.dtype, device=device)
            for lanes, v in self.parts:
                self._base[lanes] = rows(v, len(lanes))
        return self._base

    @property
    def count(self) -> int:
        return self.lanes_count

    @property
    def rank(self) -> int:
        return self._rank

    def take(self, lanes: torch.Tensor):
        """The lanes `lanes`: from the arm that holds all of them where one does (no copy of
        the other arms' rows), else from every lane's rows."""
        if self._base is None:
            for part_lanes, value in self.parts:
                at = _positions_in(part_lanes, lanes, self.lanes_count)
                if at is not None:
                    return take(value, at)
        return Lanes(self.base, lanes)

    def __repr__(self) -> str:
        return f"Split({[len(lanes) for lanes, _ in self.parts]} lanes)"


class Table:
    """A lane value as native programs read it by row (`x[i]` of each lane's own table): every
    lane's rows one after another and where each lane's first row lies. A packed value gives its
    real rows as they are: a tree's node matrices are not padded to the largest tree's node
    count (MV-RNN's were copied twice per call, 174 MB of them into 365 MB padded). Any other
    is padded to the widest lane, each lane's rows `width` apart. Made once per run and read by
    every program of it."""

    def __init__(self, value, count: int):
        self.value, self.count, self._whole = value, count, None

    def whole(self) -> torch.Tensor:
        """Every lane's value, padded, contiguous."""
        if self._whole is None:
            self._whole = rows(self.value, self.count).contiguous()
        return self._whole

    @property
    def width(self) -> int:
        return self.value.layout.width if isinstance(self.value, Packed) else self.whole().shape[1]

    def flat(self) -> torch.Tensor:
        """Every lane's rows, one after another."""
        if isinstance(self.value, Packed):
            return self.value.packed.contiguous()
        whole = self.whole()
        return whole.view(-1, *whole.shape[2:])

    def offsets(self) -> torch.Tensor:
        """Each lane's first row in `flat()`."""
        if isinstance(self.value, Packed):
            return self.value.layout.offsets
        return torch.arange(self.count, dtype=torch.int64) * self.width


def _positions_in(part: torch.Tensor, lanes: torch.Tensor, count: int) -> torch.Tensor | None:
    """Where each of `lanes` lies in `part` (both indices into `count` lanes), or None if some
    of them are not in it. (In numpy: on a batch's few dozen lanes, torch's ops cost more in
    overhead than in work.)"""
    if len(lanes) > len(part):
        return None
    where = np.full(count, -1, dtype=np.int64)
    where[part.cpu().numpy()] = np.arange(len(part))
    at = where[lanes.cpu().numpy()]
    return torch.from_numpy(at).to(lanes.device) if (at >= 0).all() else None


def merged(parts: list[tuple[torch.Tensor, "Packed"]], count: int) -> Packed:
    """One packed value of `count` lanes from parts (the lanes each holds, their packed value)."""
    first = parts[0][1]
    lengths = torch.empty(count, dtype=first.layout.lengths.dtype)
    for lanes, v in parts:
        lengths[lanes] = v.layout.lengths
    layout = RowLayout(lengths, first.layout.width)
    out = first.packed.new_empty((layout.total, *first.packed.shape[1:]))
    for lanes, v in parts:
        out[layout.lane_rows(lanes)] = v.packed
    return Packed(out, layout)


def packed_rows(value, layout: RowLayout, count: int) -> torch.Tensor:
    """A lane value's packed rows under `layout` (a shared value is every lane's)."""
    if isinstance(value, Packed) and value.layout.same(layout):
        return value.packed
    return layout.pack(rows(value, count))


def take(value, lanes: torch.Tensor):
    return value.take(lanes) if isinstance(value, Lanes) else value


def rows(value, count: int) -> torch.Tensor:
    """The value's rows for `count` lanes (a shared value repeated, as a view)."""
    if isinstance(value, Lanes):
        return value.rows()
    return value.unsqueeze(0).expand(count, *value.shape)


def lane_rank(value) -> int:
    return value.rank if isinstance(value, Lanes) else value.dim()


def apply(op: Operation, operands: list, attrs: dict, count: int, rules: dict | None = None):
    """One data op for `count` lanes: a shared result where no operand differs by lane.
    `rules`: the batching rules (default RULES)."""
    if not any(isinstance(v, Lanes) for v in operands):
        return SEMANTICS[op.op](*operands, **attrs)
    if op.op is Op.DIM:   # every lane of a batch has the same sizes
        return _dim(operands[0], attrs["dim"])
    rule = (RULES if rules is None else rules).get(op.op, _vmapped)
    out = rule(op.op, operands, attrs, count)
    dtype = op.results[0].type.dtype   # a lane's 0-d operand is a [lanes] tensor here: promotion may differ
    return Lanes(out if out.dtype == dtype else out.to(dtype))


# --------------------------------------------------------------------------- rules


def _lifted(value, rank: int) -> torch.Tensor:
    """A lane value's rows with ones inserted after the lane dim up to `rank` per lane, so that
    torch's right-aligned broadcasting pairs lane dims with lane dims; shared values as they are."""
    if not isinstance(value, Lanes):
        return value
    x = value.rows()
    return x.reshape(x.shape[0], *([1] * (rank - value.rank)), *x.shape[1:]) if value.rank < rank else x


def _elementwise(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    rank = max(lane_rank(v) for v in operands)
    return SEMANTICS[kind](*(_lifted(v, rank) for v in operands), **attrs)


def _lane_dim(dim: int, rank: int) -> int:
    return (dim % rank) + 1 if rank else 1


def _reduce(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    (x,) = operands
    if x.rank == 0:
        return _vmapped(kind, operands, attrs, count)
    dims = attrs.get("dims")
    dims = tuple(range(1, x.rank + 1)) if dims is None else tuple(_lane_dim(d, x.rank) for d in dims)
    return SEMANTICS[kind](x.rows(), dims=dims, keepdim=attrs.get("keepdim", False))


def _arg_reduce(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    (x,) = operands
    dim, keepdim = attrs.get("dim"), attrs.get("keepdim", False)
    if dim is None:
        if keepdim or x.rank == 0:
            return _vmapped(kind, operands, attrs, count)
        return SEMANTICS[kind](x.rows().reshape(count, -1), dim=1)
    return SEMANTICS[kind](x.rows(), dim=_lane_dim(dim, x.rank), keepdim=keepdim)


def _softmax(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    (x,) = operands
    return SEMANTICS[kind](x.rows(), dim=_lane_dim(attrs["dim"], x.rank))


def _matmul(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    """Every lane's product against a shared matrix is one GEMM (ACROBAT's parameter reuse)."""
    a, b = operands
    ra, rb = lane_rank(a), lane_rank(b)
    if isinstance(a, Lanes) and not isinstance(b, Lanes) and rb <= 2:
        return torch.matmul(a.rows(), b)
    if isinstance(b, Lanes) and not isinstance(a, Lanes) and ra <= 2 and rb <= 2:
        if rb == 1:   # each lane's vector times the shared matrix: rows @ A^T
            return torch.matmul(b.rows(), a.transpose(-1, -2) if ra == 2 else a)
        return torch.matmul(a, b.rows())
    if isinstance(a, Lanes) and isinstance(b, Lanes):
        if ra == rb and ra >= 2:
            return torch.matmul(a.rows(), b.rows())
        if ra == 1 and rb == 2:
            return torch.matmul(a.rows().unsqueeze(1), b.rows()).squeeze(1)
        if ra == 2 and rb == 1:
            return torch.matmul(a.rows(), b.rows().unsqueeze(-1)).squeeze(-1)
        if ra == 1 and rb == 1:
            return (a.rows() * b.rows()).sum(-1)
    return _vmapped(kind, operands, attrs, count)


def matmul_per_lane(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    """The ablation's baseline for parameter reuse: each lane's product with its own copy of a
    shared operand (a batched product over the lanes, not one GEMM)."""
    a, b = operands
    if isinstance(a, Lanes) != isinstance(b, Lanes) and lane_rank(a) <= 2 and lane_rank(b) <= 2:
        x, y = rows(a, count), rows(b, count)
        vec_a, vec_b = x.dim() == 2, y.dim() == 2
        out = torch.bmm(x.unsqueeze(1) if vec_a else x, y.unsqueeze(-1) if vec_b else y)
        return out.squeeze(-1) if vec_b else (out.squeeze(1) if vec_a else out)
    return _matmul(kind, operands, attrs, count)


def _select(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    """x[key] per lane. Basic items slice every lane at once; the per-lane (dynamic) indices then
    index together with the lane index, so a lane reading its row of its instance's table is one
    gather from the table itself (the lane's index array, when it has one, stands for the lane dim)."""
    x, dynamic = operands[0], operands[1:]
    key = attrs["key"]
    if isinstance(x, Packed) and key and key[0][0] == "int" and int(key[0][1]) >= 0 and not dynamic:
        # row k of each lane, from its packed rows (the padded value is never made)
        rest = {**attrs, "key": key[1:]}
        first = Lanes(x.first_rows(int(key[0][1])))
        return _select(kind, [first], rest, count) if key[1:] else first.rows()
    batched_x = isinstance(x, Lanes)
    basic, positions = _basic_index(attrs["key"], batched_x)
    if not positions and batched_x:
        return x.rows()[tuple(basic)]
    y = (x.base if batched_x else x)[tuple(basic)]
    index: list = [slice(None)] * y.dim()
    if batched_x:
        index[0] = x.index if x.index is not None else torch.arange(count, device=y.device)
    for p, d in zip(positions, dynamic):
        index[p] = d.rows() if isinstance(d, Lanes) else d
    out = y[tuple(index)]
    if batched_x:
        return out   # the lane index is first: the broadcast lane dim lands in front
    # only some indices vary by lane: torch puts their broadcast dim where the first one was
    # when the indexed dims are adjacent, else in front
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    return out.movedim(positions[0], 0) if adjacent else out


def _basic_index(key: tuple, lane_dim: bool) -> tuple[list, list[int]]:
    """A SELECT/UPDATE key's basic index (slices, ints, None; a whole slice where a dynamic
    index goes, and first for the lane dim if `lane_dim`), and the dims the dynamic indices
    then index in its result (an int item drops its dim)."""
    basic, positions = [slice(None)] if lane_dim else [], []
    kept = len(basic)   # dims of the result so far
    for item in key:
        if item[0] == "int":
            basic.append(item[1])
            continue
        if item[0] == "dyn":
            positions.append(kept)
        basic.append(slice(*item[1:]) if item[0] == "slice" else None if item[0] == "new" else slice(None))
        kept += 1
    return basic, positions


def _cat(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    rank = lane_rank(operands[0])
    return torch.cat([rows(v, count) for v in operands], _lane_dim(attrs["dim"], rank))


def _reshape(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    (x,) = operands
    return x.rows().reshape(count, *attrs["shape"])


def _permute(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    (x,) = operands
    return x.rows().permute(0, *(_lane_dim(d, x.rank) for d in attrs["dims"]))


def _expand(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    (x,) = operands
    shape = tuple(attrs["shape"])
    return _lifted(x, len(shape)).expand(count, *shape)


def _dim(x: Lanes, dim: int) -> torch.Tensor:
    return torch.tensor(x.base.shape[_lane_dim(dim, x.rank)], dtype=torch.int64, device=x.base.device)


def _update(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    """x[key] = v per lane, as one write into a copy of every lane's x: `_select`'s index, the
    lane index first, so the region written is (lanes, the lane's region). A decoder writing
    each instance's token at its own step ran through torch.vmap at every step (0.2 ms)."""
    x, v, *dynamic = operands
    dtypes = [(d.base if isinstance(d, Lanes) else d).dtype for d in dynamic]
    if any(dt.is_floating_point or dt is torch.bool for dt in dtypes):
        return _vmapped(kind, [Lanes(rows(x, count)), v, *dynamic], attrs, count)   # (not an integer index)
    y = rows(x, count).clone(memory_format=torch.contiguous_format)
    basic, positions = _basic_index(attrs["key"], lane_dim=True)
    view = y[tuple(basic)]   # basic indexing: a view of y
    index: list = [slice(None)] * view.dim()
    if positions:
        index[0] = torch.arange(count, device=y.device)
        for p, d in zip(positions, dynamic):
            index[p] = d.rows() if isinstance(d, Lanes) else d
    region = [view.shape[d] for d in range(1, view.dim()) if d not in positions]
    if isinstance(v, Lanes):   # each lane's value broadcast to its own region
        values = v.rows()
        extra = v.rank - len(region)   # leading dims of one that torch drops from a value of higher rank
        values = values.reshape(count, *values.shape[1 + extra:]) if extra > 0 else values
        v = values.reshape(count, *[1] * max(-extra, 0), *values.shape[1:])
    view[tuple(index)] = v
    return y


def _gather(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    """GATHER per lane where one operand is shared: a shared table read at each lane's indices
    (an embedding lookup of each instance's token) is one indexing of the table; each lane's
    table at shared indices, one indexing of every lane's rows."""
    x, idx = operands
    dim = attrs["dim"]
    if not isinstance(x, Lanes):   # the lanes' index dims land where dim was: moved in front
        return x[(slice(None),) * dim + (idx.rows(),)].movedim(dim, 0)
    if not isinstance(idx, Lanes):
        if idx.dim() == 0:
            return x.rows()[(slice(None),) * (dim + 1) + (idx.reshape(1),)].squeeze(dim + 1)
        return x.rows()[(slice(None),) * (dim + 1) + (idx,)]
    return _vmapped(kind, operands, attrs, count)


def _conv2d(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    """Every lane's images through shared filters: one convolution over all of them (the lanes'
    images side by side in its batch dim)."""
    x, *weights = operands
    if not isinstance(x, Lanes) or any(isinstance(w, Lanes) for w in weights):
        return _vmapped(kind, operands, attrs, count)
    images = x.rows()
    if x.rank == 3:   # one image per lane
        return SEMANTICS[kind](images, *weights, **attrs)
    out = SEMANTICS[kind](images.flatten(0, 1), *weights, **attrs)
    return out.view(count, images.shape[1], *out.shape[1:])


def _vmapped(kind: Op, operands: list, attrs: dict, count: int) -> torch.Tensor:
    in_dims = tuple(0 if isinstance(v, Lanes) else None for v in operands)
    args = [v.rows() if isinstance(v, Lanes) else v for v in operands]
    return torch.vmap(lambda *xs: SEMANTICS[kind](*xs, **attrs), in_dims=in_dims)(*args)


RULES: dict[Op, Callable] = {
    **{op: _elementwise for op in ELEMENTWISE},
    **{op: _reduce for op in (Op.SUM, Op.MEAN, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL)},
    Op.ARGMAX: _arg_reduce, Op.ARGMIN: _arg_reduce,
    Op.SOFTMAX: _softmax, Op.LOG_SOFTMAX: _softmax,
    Op.MATMUL: _matmul,
    Op.SELECT: _select,
    Op.CAT: _cat,
    Op.RESHAPE: _reshape,
    Op.PERMUTE: _permute,
    Op.EXPAND: _expand,
    Op.UPDATE: _update,
    Op.GATHER: _gather,
    Op.CONV2D: _conv2d,
}
