"""The one exception every lift raises for something it cannot express exactly."""


class LiftError(Exception):
    """An operator (or one of its attributes, shapes or dtypes) the IR lift does not support.

    Lifting never guesses: anything that cannot be expressed exactly in the IR (symbolic shapes,
    layouts TVM itself cannot legalize, dtype conversions the IR has no node for, ...) raises this
    error with a message naming the operator and the reason, so that callers can leave the
    operator untouched.
    """
