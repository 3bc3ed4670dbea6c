"""Optimizers with candle-nn's semantics, eager and functional.

Eager (candle-nn): `opt = AdamW(vars, lr)`, `opt.step(grads)` applies one update from a
GradStore, `opt.backward_step(loss)` computes the gradients and steps; the variables then point
at their updated values.  Functional (for `lc.jit` / `lc.compile`, so a whole training step is
one program): `state = opt.init(params)` and `new_params, new_state = opt.update(params, grads,
state)`, where params, grads and state are flat tuples of tensors (placeholders under tracing);
nothing is realized.  Both run the same update expression: one fused elementwise kernel per
parameter (it writes the parameter and its state together), and the eager step realizes all
parameters in one graph.  Adam's step count lives in the state as the running products
beta1^t and beta2^t (shape-() f64 tensors), so a new step never traces or compiles again."""
from __future__ import annotations

from .autograd import _replace_var, gradients
from .compiler import realize_nodes
from .errors import ShapeMismatch


def _check_lengths(opt, params, grads, state):
    want = opt.per_param * len(params) + opt.shared
    if len(grads) != len(params) or len(state) != want:
        raise ShapeMismatch(f"{type(opt).__name__}.update: {len(params)} params need {len(params)} grads and "
                            f"{want} state tensors, got {len(grads)} and {len(state)}")


class _Optimizer:
    """The eager side: the optimizer keeps its variables and a realized functional state."""
    per_param, shared = 0, 0         # state tensors: per parameter, and shared (at the end)

    def __init__(self, vars, lr):
        self.vars = list(vars)
        self.lr = float(lr)
        self._state = None           # the functional state of self.vars, built on the first step

    def learning_rate(self) -> float:
        return self.lr

    def set_learning_rate(self, lr) -> None:
        self.lr = float(lr)

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
            new_p.append(p - g * self.lr)
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
        step_m, scale_v = (1.0 - b1t).recip() * self.lr, (1.0 - b2t).recip()   # lr / (1 - b1^t), 1 / (1 - b2^t)
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(params, grads, state[:n], state[n:2 * n]):
            m = m * b1 + g * (1.0 - b1)
            v = v * b2 + g.sqr() * (1.0 - b2)
            lr_m, sv = step_m.to_dtype(p.dtype), scale_v.to_dtype(p.dtype)
            new_p.append(p * (1.0 - self.lr * self.weight_decay) - m * lr_m / ((v * sv).sqrt() + self.eps))
            new_m.append(m)
            new_v.append(v)
        return tuple(new_p), tuple(new_m) + tuple(new_v) + (b1t, b2t)
