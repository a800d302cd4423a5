"""Imports every op-family module so that their ``@register_lift`` lifts are registered."""

# pylint: disable=unused-import
from . import call_tir  # noqa: F401
from . import conv  # noqa: F401
from . import conv_transpose  # noqa: F401
from . import elementwise  # noqa: F401
from . import gather  # noqa: F401
from . import layout  # noqa: F401
from . import linalg  # noqa: F401
from . import pool  # noqa: F401
from . import reduce  # noqa: F401
