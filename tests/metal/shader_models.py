"""NumPy models of the Metal kernels, one function per kernel, run on CPU in float32.

Each model takes the same named arguments the launcher passes to the shader (and the launch
geometry: groups, group_size) and follows the shader's algorithm: the same grid-to-work mapping,
the same per-simdgroup key split and merge (sdpa), the same partition rule (it is handed the
launcher's partitions and keys_per_partition), framing with reflection, twiddle-table DFT and mel
projection (fbank), conv | abs | pool | leaky (conv), gate math (lstm) and the layer loop
(segdense). Tests route the launchers' dispatch here and compare with float64 references: this
checks the algorithms and the launchers' argument plumbing on Linux; the Metal compiler and the
GPU are checked only by the @mps tests.
"""
from __future__ import annotations

import numpy as np
import torch

F32 = np.float32
SIMD_WIDTH = 32


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def _write(out: torch.Tensor, values: np.ndarray) -> None:
    out.copy_(torch.from_numpy(np.ascontiguousarray(values, dtype=F32)).reshape(out.shape).to(out.dtype))


# ------------------------------------------------------------------------------------ sdpa_decode

def sdpa_reach(valid_keys: int, query_len: int, causal_mode: int) -> int:
    return min(valid_keys, query_len) if causal_mode == 1 else valid_keys


def sdpa_key_end(valid_keys: int, query_index: int, query_len: int, causal_mode: int) -> int:
    if causal_mode == 1:
        return min(valid_keys, query_index + 1)
    if causal_mode == 2:
        return min(valid_keys, valid_keys - query_len + query_index + 1)
    return valid_keys


def _fmax(values) -> F32:
    """The shader's max(): a NaN operand is dropped (fmax), -inf for no values."""
    return F32(np.fmax.reduce(np.asarray(values, F32), initial=-np.inf))


def _safe(maximum) -> F32:
    return F32(0) if maximum == -np.inf else maximum


def _simdgroup_states(q, keys, values, mask_row, begin, end, visible_end, n_simd, scale):
    """(max, sum, unnormalised acc) of each simdgroup: simdgroup g takes keys begin + g, + n_simd, ...;
    keys at or past visible_end are masked additively (score - inf) and still weigh in with 0."""
    states = []
    q_scaled = q.astype(F32) * F32(scale)
    for group in range(n_simd):
        index = np.arange(begin + group, max(end, begin), n_simd)
        with np.errstate(invalid="ignore"):
            scores = (keys[index] @ q_scaled).astype(F32)
            if mask_row is not None:
                scores = scores + mask_row[index]
            scores = np.where(index >= visible_end, scores - np.inf, scores).astype(F32)
            running_max = _fmax(scores)
            weights = np.exp(scores - _safe(running_max)).astype(F32)
            states.append((running_max, weights.sum(dtype=F32), (weights @ values[index]).astype(F32)))
    return states


def _merge(states):
    merged_max = _fmax([m for m, _, _ in states])
    merged_sum = F32(0)
    acc = np.zeros_like(states[0][2])
    with np.errstate(invalid="ignore"):
        for m, s, a in states:
            weight = np.exp(F32(m - _safe(merged_max)))
            merged_sum += s * weight
            acc = acc + a * weight
    return merged_max, merged_sum, acc


def _normalised(merged_max, merged_sum, acc):
    """(out row, lse) as the shaders finish a row: a zero sum means no key (0, -inf); NaN stays NaN."""
    with np.errstate(invalid="ignore"):
        if merged_sum == 0:
            return acc * F32(0), -np.inf
        return acc * (F32(1) / merged_sum), merged_max + np.log(merged_sum)


def _sdpa_row(row, values, begin_end):
    num_heads, query_len = values["num_heads"], values["query_len"]
    b, hq, qi = row // (num_heads * query_len), (row // query_len) % num_heads, row % query_len
    hkv = hq // (num_heads // values["num_kv_heads"])
    seqlens = values["seqlens"].cpu().numpy()
    reach = sdpa_reach(int(seqlens[b]), query_len, values["causal_mode"])
    visible_end = sdpa_key_end(int(seqlens[b]), qi, query_len, values["causal_mode"])
    begin, end = begin_end(reach)
    query = _f32(values["query"]).reshape(-1, values["head_dim"])[row]
    keys = _f32(values["key"])[b, hkv]
    vals = _f32(values["value"])[b, hkv]
    mask = _f32(values["mask"]).reshape(-1, values["seq_kv"])[row] if values["has_mask"] else None
    return query, keys, vals, mask, begin, end, visible_end


def sdpa_decode_one_pass(*, groups, group_size, **values):
    n_simd = group_size // SIMD_WIDTH
    out = np.zeros((groups, values["head_dim_v"]), F32)
    lse = np.zeros(groups, F32)
    for row in range(groups):
        q, k, v, mask, begin, end, visible_end = _sdpa_row(row, values, lambda reach: (0, reach))
        states = _simdgroup_states(q, k, v, mask, begin, end, visible_end, n_simd, values["scale"])
        out[row], lse[row] = _normalised(*_merge(states))
    _write(values["out"], out)
    _write(values["lse"], lse)


def sdpa_decode_split(*, groups, group_size, **values):
    n_simd = group_size // SIMD_WIDTH
    partitions, per_partition = values["partitions"], values["keys_per_partition"]
    partial_out = np.zeros((groups, values["head_dim_v"]), F32)
    partial_max_sum = np.zeros((groups, 2), F32)
    for group in range(groups):
        row, partition = divmod(group, partitions)
        begin = partition * per_partition
        q, k, v, mask, begin, end, visible_end = _sdpa_row(
            row, values, lambda reach: (begin, min(begin + per_partition, reach)))
        merged_max, merged_sum, acc = _merge(_simdgroup_states(q, k, v, mask, begin, end, visible_end, n_simd,
                                                               values["scale"]))
        partial_out[group] = acc
        partial_max_sum[group] = (merged_max, merged_sum)
    _write(values["partial_out"], partial_out)
    _write(values["partial_max_sum"], partial_max_sum)


def sdpa_decode_combine(*, groups, group_size, **values):
    partitions = values["partitions"]
    partial_out = _f32(values["partial_out"]).reshape(groups, partitions, -1)
    max_sum = _f32(values["partial_max_sum"]).reshape(groups, partitions, 2)
    out = np.zeros((groups, values["head_dim_v"]), F32)
    lse = np.zeros(groups, F32)
    for row in range(groups):
        states = [(m, s, partial_out[row, p]) for p, (m, s) in enumerate(max_sum[row])]
        out[row], lse[row] = _normalised(*_merge(states))
    _write(values["out"], out)
    _write(values["lse"], lse)


# ------------------------------------------------------------------------------------------ fbank

def _reflect(index: np.ndarray, samples: int) -> np.ndarray:
    index = np.where(index < 0, -index - 1, index)
    return np.where(index >= samples, 2 * samples - 1 - index, index)


def fbank_frames(*, groups, group_size, **v):
    samples, frames, size, fft = v["samples"], v["frames"], v["window_size"], v["fft_size"]
    wave = _f32(v["wave"]).reshape(-1, samples)
    start = np.arange(frames)[:, None] * v["shift"] - v["pad"] + np.arange(size)[None, :]
    raw = wave[:, _reflect(start, samples)]  # (B, frames, window_size)
    if v["remove_dc_offset"]:
        raw = raw - raw.mean(-1, keepdims=True, dtype=F32)
    raw_sum_squares = (raw * raw).sum(-1, dtype=F32)
    previous = np.concatenate([raw[..., :1], raw[..., :-1]], -1)
    framed = (raw - F32(v["preemphasis"]) * previous) * _f32(v["window"])
    windowed_sum_squares = (framed * framed).sum(-1, dtype=F32)
    bins = fft // 2 + 1
    phase = (np.arange(bins)[:, None] * np.arange(size)[None, :]) % fft
    real = framed @ _f32(v["twiddle_cos"])[phase].T
    imag = -(framed @ _f32(v["twiddle_sin"])[phase].T)
    power = (real * real + imag * imag).astype(F32)
    spectrum = power if v["use_power"] else np.sqrt(power)
    energies = spectrum @ _f32(v["mel"]).T
    eps = F32(v["epsilon"])
    features = np.log(np.maximum(energies, eps)) if v["use_log_fbank"] else energies
    sum_squares = raw_sum_squares if v["raw_energy"] else windowed_sum_squares
    log_energy = np.maximum(np.log(np.maximum(sum_squares, eps)), F32(v["log_energy_floor"]))
    _write(v["out"], features)
    _write(v["log_energy"], log_energy)


# ------------------------------------------------------------------------------------------- conv

def conv1d_pool(*, groups, group_size, **v):
    x = _f32(v["x"])
    weight = _f32(v["weight"])
    padding, stride, dilation, taps = v["padding"], v["stride"], v["dilation"], v["taps"]
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding + dilation * taps + stride)))
    conv_len = v["conv_len"]
    conv = np.zeros((x.shape[0], v["c_out"], conv_len), F32)
    for t in range(taps):
        offsets = np.arange(conv_len) * stride + t * dilation
        conv += np.einsum("oc,bcl->bol", weight[:, :, t], padded[:, :, offsets]).astype(F32)
    if v["has_bias"]:
        conv += _f32(v["bias"])[None, :, None]
    if v["apply_abs"]:
        conv = np.abs(conv)
    pool, pool_stride, length_out = v["pool_size"], v["pool_stride"], v["length_out"]
    pooled = np.full((x.shape[0], v["c_out"], length_out), -np.inf, F32)
    for j in range(pool):
        positions = np.arange(length_out) * pool_stride + j
        valid = positions < conv_len
        pooled[:, :, valid] = np.maximum(pooled[:, :, valid], conv[:, :, positions[valid]])  # NaN pools to NaN
    slope = F32(v["negative_slope"])
    _write(v["out"], np.where(pooled >= 0, pooled, slope * pooled))


def instance_norm_act(*, groups, group_size, **v):
    x = _f32(v["x"]).reshape(groups, v["length"])
    shifted = x - x[:, :1]                                   # statistics of x - center, center = x[0]
    mean = shifted.mean(-1, keepdims=True, dtype=F32)
    variance = ((shifted - mean) ** 2).mean(-1, keepdims=True, dtype=F32)
    scale = F32(1) / np.sqrt(variance + F32(v["eps"]))
    channels = np.arange(groups) % v["channels"]
    beta = np.zeros((groups, 1), F32)
    if v["has_affine"]:
        scale = scale * _f32(v["gamma"])[channels][:, None]
        beta = _f32(v["beta"])[channels][:, None]
    y = shifted * scale + (beta - mean * scale)
    _write(v["out"], np.where(y >= 0, y, F32(v["negative_slope"]) * y))


# ------------------------------------------------------------------------------------------- lstm

def _sigmoid(x):
    return F32(1) / (F32(1) + np.exp(-x))


def lstm_input_projection(*, groups, group_size, **v):
    x = _f32(v["x"]).reshape(v["seq"], v["batch"], v["input_size"])
    gates = np.einsum("tbk,dgk->dtbg", x, _f32(v["w_ih"])) + _f32(v["bias"])[:, None, None, :]
    _write(v["gates_x"], gates)


def _cell(gates_row, w_hh, h_prev, c_prev, hidden):
    pre = gates_row + h_prev @ w_hh.T
    i, f, g, o = (pre[..., k * hidden:(k + 1) * hidden] for k in range(4))
    c = _sigmoid(f) * c_prev + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def lstm_recurrence_step(*, groups, group_size, **v):
    seq, batch, hidden, dirs, step = v["seq"], v["batch"], v["hidden"], v["directions"], v["step"]
    gates = _f32(v["gates_x"]).reshape(dirs, seq, batch, 4 * hidden)
    w_hh = _f32(v["w_hh"]).reshape(dirs, 4 * hidden, hidden)
    h_in = _f32(v["h_in"]).reshape(dirs, batch, hidden)
    c_state = _f32(v["c_state"]).reshape(dirs, batch, hidden)
    y = _f32(v["y"]).reshape(seq, batch, dirs * hidden)
    h_out = np.zeros_like(h_in)
    for direction in range(dirs):
        t = step if direction == 0 else seq - 1 - step
        h, c = _cell(gates[direction, t], w_hh[direction], h_in[direction], c_state[direction], hidden)
        h_out[direction], c_state[direction] = h, c
        y[t, :, direction * hidden:(direction + 1) * hidden] = h
    _write(v["h_out"], h_out)
    _write(v["c_state"], c_state)
    _write(v["y"], y)


def lstm_recurrence_persistent(*, groups, group_size, **v):
    seq, batch, hidden, dirs = v["seq"], v["batch"], v["hidden"], v["directions"]
    gates = _f32(v["gates_x"]).reshape(dirs, seq, batch, 4 * hidden)
    w_hh = _f32(v["w_hh"]).reshape(dirs, 4 * hidden, hidden)
    h = _f32(v["h0"]).reshape(dirs, batch, hidden).copy()
    c = _f32(v["c0"]).reshape(dirs, batch, hidden).copy()
    y = np.zeros((seq, batch, dirs * hidden), F32)
    for direction in range(dirs):
        for step in range(seq):
            t = step if direction == 0 else seq - 1 - step
            h[direction], c[direction] = _cell(gates[direction, t], w_hh[direction], h[direction], c[direction],
                                               hidden)
            y[t, :, direction * hidden:(direction + 1) * hidden] = h[direction]
    _write(v["y"], y)
    _write(v["h_n"], h)
    _write(v["c_n"], c)


# --------------------------------------------------------------------------------------- segdense

def segdense_head(*, groups, group_size, **v):
    dims = v["layer_dims"].cpu().numpy().tolist()
    current = _f32(v["x"]).reshape(groups, dims[0])
    weights, biases = _f32(v["weights"]), _f32(v["biases"])
    weight_offset = bias_offset = 0
    for layer in range(v["num_layers"]):
        width_in, width_out = dims[layer], dims[layer + 1]
        w = weights[weight_offset:weight_offset + width_out * width_in].reshape(width_out, width_in)
        current = (current @ w.T + biases[bias_offset:bias_offset + width_out]).astype(F32)
        if layer + 1 < v["num_layers"]:
            current = np.where(current >= 0, current, F32(v["negative_slope"]) * current)
        weight_offset += width_out * width_in
        bias_offset += width_out
    if v["activation"] == 1:
        largest = current.max(-1, keepdims=True)
        current = current - (largest + np.log(np.exp(current - largest).sum(-1, keepdims=True)))
    elif v["activation"] == 2:
        current = _sigmoid(current)
    _write(v["out"], current)


MODELS = {
    "sdpa_decode_one_pass": sdpa_decode_one_pass, "sdpa_decode_split": sdpa_decode_split,
    "sdpa_decode_combine": sdpa_decode_combine, "fbank_frames": fbank_frames, "conv1d_pool": conv1d_pool,
    "instance_norm_act": instance_norm_act, "lstm_input_projection": lstm_input_projection,
    "lstm_recurrence_step": lstm_recurrence_step, "lstm_recurrence_persistent": lstm_recurrence_persistent,
    "segdense_head": segdense_head,
}
