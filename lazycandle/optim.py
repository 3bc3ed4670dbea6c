"""Optimizers with candle-nn's semantics, eager and functional.

Eager (candle-nn): `opt = AdamW(vars, lr)`, `opt.step(grads)` applies one update from a
GradStore, `opt.backward_step(loss)` computes the gradients and steps; the variables then point
at their updated values.  Functional (for `lc.jit` / `lc.compile`, so a whole training step is
one program): `state = opt.init(params)` and `new_params, new_state = opt.update(params, grads,
state)`, where params, grads and state are flat tuples of tensors (placeholders under tracing);
nothing is realized.  Both run the same update expression: one fused elementwise kernel per
parameter (it writes the parameter and its state together), merged by the scheduler into ONE
kernel per dtype with a segment per parameter (ir/horizontal.py), and the eager step realizes
all parameters in one graph.  Adam's step count lives in the state as the running products
beta1^t and beta2^t (shape-() f64 tensors), so a new step never traces or compiles again.
The learning rate is a realized shape-() f64 tensor the update reads at run time: setting
`opt.lr` writes the new value into it, so a compiled step (`lc.jit` / `lc.compile` over
`opt.update`) uses it at its next run without a retrace or a compile."""
from __future__ import annotations

from .autograd import _TRAINABLE, GradStore, _replace_var, gradients
from .compiler import realize_nodes
from .errors import ShapeMismatch
from .runtime.buffers import forget


def _check_lengths(opt, params, grads, state):
    want = opt.per_param * len(params) + opt.shared
    if len(grads) != len(params) or len(state) != want:
        raise ShapeMismatch(f"{type(opt).__name__}.update: {len(params)} params need {len(params)} grads and "
                            f"{want} state tensors, got {len(grads)} and {len(state)}")


class _Optimizer:
    """The eager side: the optimizer keeps its variables and a realized functional state."""
    per_param, shared = 0, 0         # state tensors: per parameter, and shared (at the end)

    def __init__(self, vars, lr):
        from .tensor import tensor
        self.vars = list(vars)
        self._lr_value = float(lr)
        self._lr = tensor(self._lr_value, "f64")     # read by the update graphs at run time
        self._state = None           # the functional state of self.vars, built on the first step

    @property
    def lr(self) -> float:
        return self._lr_value

    @lr.setter
    def lr(self, value) -> None:
        """Takes effect at the next run of any update built before, compiled ones included."""
        value = float(value)
        buf = self._lr._node.buffer
        forget(buf)                  # (no recycled result may share it)
        buf[...] = value
        self._lr_value = value

    def learning_rate(self) -> float:
        return self.lr

    def set_learning_rate(self, lr) -> None:
        self.lr = lr

    def step(self, grads) -> None:
        """One update of every variable `grads` has a gradient for (candle skips the others;
        their state does not move either)."""
        if self._state is None:
            self._state = list(self.init(self.vars))
        n, k = len(self.vars), self.per_param
        picked = [i for i, v in enumerate(self.vars) if grads.get(v) is not None]
        params = [self.vars[i] for i in picked]
        state = [self._state[j * n + i] for j in range(k) for i in picked] + self._state[k * n:]
        new_p, new_s = self.update(params, [grads.get(v) for v in params], state)
        realize_nodes([t._node for t in new_p] + [t._node for t in new_s])
        for t in new_s:
            t._node.origin = None           # state carries values across steps, not graphs
        for j in range(k):
            for a, i in enumerate(picked):
                self._state[j * n + i] = new_s[j * len(picked) + a]
        self._state[k * n:] = new_s[k * len(picked):]
        for v, t in zip(params, new_p):
            _replace_var(v, t._node)

    def backward_step(self, loss) -> None:
        self.step(gradients(loss, keep_all=False))


class SGD(_Optimizer):
    """v <- v - lr * b with b = momentum * b + g (b = g on the first step, and without momentum).
    Functional state: the momentum buffers (none without momentum)."""

    def __init__(self, vars, lr, momentum=0.0):
        super().__init__(vars, lr)
        self.momentum = float(momentum)
        self.per_param = 1 if self.momentum else 0

    def init(self, params) -> tuple:
        from .tensor import zeros
        return tuple(zeros(p.shape, p.dtype) for p in params) if self.momentum else ()

    def update(self, params, grads, state) -> tuple:
        _check_lengths(self, params, grads, state)
        new_p, new_s = [], []
        for i, (p, g) in enumerate(zip(params, grads)):
            if self.momentum:
                g = state[i] * self.momentum + g
                new_s.append(g)
            new_p.append(p - g * self._lr.to_dtype(p.dtype))
        return tuple(new_p), tuple(new_s)


class AdamW(_Optimizer):
    """candle-nn's AdamW: decoupled weight decay, bias-corrected moments.  Functional state:
    the first moments, the second moments, then beta1^t and beta2^t."""
    per_param, shared = 2, 2

    def __init__(self, vars=(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(vars, lr)
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps, self.weight_decay = float(eps), float(weight_decay)

    def init(self, params) -> tuple:
        from .tensor import ones, zeros
        moments = tuple(zeros(p.shape, p.dtype) for p in params)
        return moments + moments + (ones((), "f64"), ones((), "f64"))

    def update(self, params, grads, state) -> tuple:
        _check_lengths(self, params, grads, state)
        n = len(params)
        b1, b2 = self.beta1, self.beta2
        b1t, b2t = state[2 * n] * b1, state[2 * n + 1] * b2
        step_m, scale_v = (1.0 - b1t).recip() * self._lr, (1.0 - b2t).recip()   # lr / (1 - b1^t), 1 / (1 - b2^t)
        decay = 1.0 - self._lr * self.weight_decay
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(params, grads, state[:n], state[n:2 * n]):
            m = m * b1 + g * (1.0 - b1)
            v = v * b2 + g.sqr() * (1.0 - b2)
            lr_m, sv = step_m.to_dtype(p.dtype), scale_v.to_dtype(p.dtype)
            new_p.append(p * decay.to_dtype(p.dtype) - m * lr_m / ((v * sv).sqrt() + self.eps))
            new_m.append(m)
            new_v.append(v)
        return tuple(new_p), tuple(new_m) + tuple(new_v) + (b1t, b2t)


class Adam(AdamW):
    """torch.optim.Adam: weight decay is L2, added to the gradient (g + weight_decay * p), not
    decoupled; the moments and the bias-corrected step follow torch's formula term by term
    (m by lerp, denominator sqrt(v) / sqrt(1 - beta2^t) + eps).  State as AdamW's."""

    def __init__(self, vars=(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(vars, lr, betas, eps, weight_decay)

    def update(self, params, grads, state) -> tuple:
        _check_lengths(self, params, grads, state)
        n = len(params)
        b1, b2 = self.beta1, self.beta2
        b1t, b2t = state[2 * n] * b1, state[2 * n + 1] * b2
        step_size, bc2_sqrt = self._lr / (1.0 - b1t), (1.0 - b2t).sqrt()
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(params, grads, state[:n], state[n:2 * n]):
            if self.weight_decay:
                g = g + p * self.weight_decay
            m = m + (g - m) * (1.0 - b1) if b1 > 0.5 else g - (g - m) * b1      # torch's lerp
            v = v * b2 + g * (1.0 - b2) * g
            denom = v.sqrt() / bc2_sqrt.to_dtype(p.dtype) + self.eps
            new_p.append(p - m * step_size.to_dtype(p.dtype) / denom)
            new_m.append(m)
            new_v.append(v)
        return tuple(new_p), tuple(new_m) + tuple(new_v) + (b1t, b2t)


def clip_grad_norm(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_: scale the gradients in place by min(1, max_norm /
    (total + 1e-6)), total being the 2-norm of all of them together, and return that total
    (a shape-() tensor, taken before clipping).  `grads`: a list of gradient tensors (its items
    are replaced) or a GradStore (the gradients of its trainable tensors are).  As torch: no
    check of max_norm (0 zeroes the gradients, a negative one flips them) and a NaN or inf
    total is no error: it is returned and the gradients become NaN (or 0 where finite, for inf)."""
    if isinstance(grads, GradStore):
        items = [(nid, g) for nid, g in grads._grads.items() if grads._nodes[nid] in _TRAINABLE]
    elif isinstance(grads, list):
        items = list(enumerate(grads))
    else:
        raise TypeError(f"clip_grad_norm: grads must be a list of tensors or a GradStore (it is changed in "
                        f"place), got {type(grads).__name__}")
    from .tensor import zeros
    if not items:
        return zeros((), "f32")
    gs = [g for _, g in items]
    wide = "f64" if any(g.dtype.name == "f64" for g in gs) else "f32"
    if not all(g.dtype.is_float for g in gs):
        raise TypeError(f"clip_grad_norm: gradients must be float, got "
                        f"{sorted({g.dtype.name for g in gs if not g.dtype.is_float})}")
    sq = [g.to_dtype("f64").sqr().sum_all() for g in gs]
    total = sum(sq[1:], sq[0]).sqrt().to_dtype(wide if len({g.dtype.name for g in gs}) > 1 else gs[0].dtype)
    coef = (max_norm / (total.to_dtype(wide) + 1e-6)).minimum(1.0)
    for key, g in items:
        clipped = g * coef.to_dtype(g.dtype)
        if isinstance(grads, list):
            grads[key] = clipped
        else:
            grads._grads[key] = clipped
    return total
