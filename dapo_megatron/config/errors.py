"""The one exception type for user errors in configuration.

The CLI catches it and prints its message on one line without a traceback: a bad key or
value is the user's to fix, not a bug to debug.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem the user must fix; the message names key, file and fix."""
