"""Optimizers with candle-nn's semantics: `step(grads)` applies one update from a GradStore,
`backward_step(loss)` computes the gradients and steps.  Each update is one fused elementwise
expression per variable, and all variables (and optimizer state) realize in one graph; the
variable then points at its updated value."""
from __future__ import annotations

from .autograd import _replace_var, gradients
from .compiler import realize_nodes


class _Optimizer:
    def __init__(self, vars, lr):
        self.vars = list(vars)
        self.lr = float(lr)

    def learning_rate(self) -> float:
        return self.lr

    def set_learning_rate(self, lr) -> None:
        self.lr = float(lr)

    def step(self, grads) -> None:
        updates = [(i, v, grads.get(v)) for i, v in enumerate(self.vars)]
        updates = [(i, v, g) for i, v, g in updates if g is not None]
        new, state = self._updates(updates)
        realize_nodes([t._node for t in new] + [t._node for t in state])
        for t in state:
            t._node.origin = None           # state carries values across steps, not graphs
        for (_, v, _), t in zip(updates, new):
            _replace_var(v, t._node)

    def backward_step(self, loss) -> None:
        self.step(gradients(loss, keep_all=False))


class SGD(_Optimizer):
    """v <- v - lr * b with b = momentum * b + g (b = g on the first step, and without momentum)."""

    def __init__(self, vars, lr, momentum=0.0):
        super().__init__(vars, lr)
        self.momentum = float(momentum)
        self._buf = {}

    def _updates(self, updates):
        new, state = [], []
        for i, v, g in updates:
            if self.momentum:
                prev = self._buf.get(i)
                g = g if prev is None else prev * self.momentum + g
                self._buf[i] = g
                state.append(g)
            new.append(v - g * self.lr)
        return new, state


class AdamW(_Optimizer):
    """candle-nn's AdamW: decoupled weight decay, bias-corrected moments."""

    def __init__(self, vars, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(vars, lr)
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.step_t = 0
        self._m, self._v = {}, {}

    def _updates(self, updates):
        self.step_t += 1
        b1, b2 = self.beta1, self.beta2
        scale_m, scale_v = 1.0 / (1.0 - b1 ** self.step_t), 1.0 / (1.0 - b2 ** self.step_t)
        new, state = [], []
        for i, v, g in updates:
            m = g * (1.0 - b1) if i not in self._m else self._m[i] * b1 + g * (1.0 - b1)
            s = g.sqr() * (1.0 - b2) if i not in self._v else self._v[i] * b2 + g.sqr() * (1.0 - b2)
            self._m[i], self._v[i] = m, s
            state += [m, s]
            theta = v * (1.0 - self.lr * self.weight_decay)
            new.append(theta - (m * scale_m) * self.lr / ((s * scale_v).sqrt() + self.eps))
        return new, state
