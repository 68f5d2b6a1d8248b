"""Library modules captured through Python code of our own instead of their fused kernels.

`nn.LSTM`, `nn.GRU` and `nn.RNN` run one fused sequence op in eager PyTorch. Here a call of
one runs `recurrent_layers` instead: their time loops written with the cells, converted and
captured like the user's code, so they become the same `loop` ops a hand-written cell loop
does (and get the same loop distribution and hoisted input projections). Its errors point at the user's call of the module: this file is not user code.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from cocktailer.errors import UnsupportedError

_CELLS = {"LSTM": torch.lstm_cell, "GRU": torch.gru_cell, "RNN_TANH": torch.rnn_tanh_cell,
          "RNN_RELU": torch.rnn_relu_cell}
_RECURRENT = (nn.LSTM.forward, nn.GRU.forward, nn.RNN.forward)


def replacement(module: nn.Module):
    """The function a call of `module` runs instead of its forward, or None."""
    if isinstance(module, nn.RNNBase) and type(module).forward in _RECURRENT:
        return recurrent_layers
    return None


def _check(module, input):
    if isinstance(input, nn.utils.rnn.PackedSequence):
        raise UnsupportedError(f"nn.{type(module).__name__} on a PackedSequence",
                               hint="pass the padded tensor (and mask the padding) instead")
    if getattr(module, "proj_size", 0):
        raise UnsupportedError("nn.LSTM with proj_size")
    if module.training and module.dropout and module.num_layers > 1:
        raise UnsupportedError(f"nn.{type(module).__name__} dropout between layers in training mode (it is random)",
                               hint="call model.eval()")


def recurrent_layers(module, input, hx=None):
    _check(module, input)
    lstm = module.mode == "LSTM"
    cell = _CELLS[module.mode]
    directions = 2 if module.bidirectional else 1
    unbatched = input.dim() == 2
    x = input.unsqueeze(1) if unbatched else input.transpose(0, 1) if module.batch_first else input
    steps, batch = x.shape[0], x.shape[1]
    if hx is None:
        h0 = x.new_zeros(module.num_layers * directions, batch, module.hidden_size)
        c0 = x.new_zeros(module.num_layers * directions, batch, module.hidden_size) if lstm else None
    elif lstm:
        h0, c0 = (hx[0].unsqueeze(1), hx[1].unsqueeze(1)) if unbatched else hx
    else:
        h0, c0 = (hx.unsqueeze(1) if unbatched else hx), None
    per_direction = len(module._flat_weights) // (module.num_layers * directions)
    if directions == 1:
        weights = [module._flat_weights[k * per_direction:(k + 1) * per_direction] for k in range(module.num_layers)]
        x, last_h, last_c = _stacked(cell, lstm, x, h0, c0, weights, steps)
    else:
        x, last_h, last_c = _bidirectional(cell, lstm, x, h0, c0, module, per_direction, steps)
    out = x.squeeze(1) if unbatched else x.transpose(0, 1) if module.batch_first else x
    h_n = torch.stack(last_h)
    h_n = h_n.squeeze(1) if unbatched else h_n
    if not lstm:
        return out, h_n
    c_n = torch.stack(last_c)
    return out, (h_n, c_n.squeeze(1) if unbatched else c_n)


def _stacked(cell, lstm, x, h0, c0, weights, steps):
    """Unidirectional layers: one time loop that runs the input up through every layer, the
    form a hand-written stacked cell loop has (loop distribution then splits it per layer)."""
    h = [h0[k] for k in range(len(weights))]
    c = [c0[k] for k in range(len(weights))] if lstm else []
    out = x.new_zeros(steps, x.shape[1], h0.shape[-1])
    for t in range(steps):
        inp = x[t]
        new_h, new_c = [], []
        for layer in range(len(weights)):
            if lstm:
                h_i, c_i = cell(inp, (h[layer], c[layer]), *weights[layer])
                new_c.append(c_i)
            else:
                h_i = cell(inp, h[layer], *weights[layer])
            new_h.append(h_i)
            inp = h_i
        h, c = new_h, new_c
        out[t] = inp
    return out, h, c


def _bidirectional(cell, lstm, x, h0, c0, module, per_direction, steps):
    """Layer by layer, each direction its own time loop; a layer reads both directions' outputs."""
    last_h, last_c = [], []
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(2):
            k = layer * 2 + direction
            weights = module._flat_weights[k * per_direction:(k + 1) * per_direction]
            out, h, c = _direction(cell, lstm, x, h0[k], c0[k] if lstm else None, weights, direction == 1, steps)
            outputs.append(out)
            last_h.append(h)
            last_c.append(c)
        x = torch.cat(outputs, 2)
    return x, last_h, last_c


def _direction(cell, lstm, x, h, c, weights, reverse, steps):
    """One layer in one direction: its time loop, every step's state written to `out`."""
    out = x.new_zeros(steps, x.shape[1], h.shape[-1])
    for t in range(steps):
        i = -1 - t if reverse else t   # from the end (an index wraps as in Python): steps may be symbolic
        if lstm:
            h, c = cell(x[i], (h, c), *weights)
        else:
            h = cell(x[i], h, *weights)
        out[i] = h
    return out, h, c
