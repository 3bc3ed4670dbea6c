"""Typed errors.  Every class derives from `Error` and from the matching built-in, so plain
Python code can catch them (`except ValueError`).  Messages name the op, shapes and dtypes."""


class Error(Exception):
    """Base of every lazycandle error."""


class DTypeMismatchBinaryOp(Error, TypeError):
    pass


class UnsupportedDTypeForOp(Error, TypeError):
    pass


class UnsupportedDType(Error, TypeError):
    pass


class ShapeMismatchBinaryOp(Error, ValueError):
    pass


class BroadcastIncompatibleShapes(Error, ValueError):
    pass


class ShapeMismatch(Error, ValueError):
    pass


class DimOutOfRange(Error, IndexError):
    pass


class NarrowInvalidArgs(Error, ValueError):
    pass


class IndexOutOfBounds(Error, IndexError):
    pass


class EmptyReduction(Error, ValueError):
    pass


class UnboundPlaceholder(Error):
    pass


class FeedError(Error, ValueError):
    pass


class SymbolicSizeError(Error, TypeError):
    """A Python value was asked of an lc.Size (int(), bool(), range(), an `if`) before its
    named dims are bound."""


class SerializationError(Error, ValueError):
    """A tensor file that is truncated, corrupt or does not match what it declares."""


class SchedulerError(Error):
    """Internal: the scheduler's kernels are not a valid execution order (a bug, never bad input)."""


def names_op(op: str):
    """Decorator for an op built from other ops: a typed error raised inside it names `op`
    first ("layer_norm: broadcast_mul: shape mismatch ..."), so the message starts with the
    call the user made; the class stays the inner error's."""
    import functools

    def wrap(fn):
        @functools.wraps(fn)
        def named(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Error as e:
                if str(e).startswith(op + ":"):
                    raise
                raise type(e)(f"{op}: {e}") from e
        return named
    return wrap
