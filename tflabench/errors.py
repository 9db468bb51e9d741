"""The one exception type for user mistakes.

Library code raises :class:`UserError` (a ``ValueError``) for bad input that a user can
fix: a bad option value, an invalid suite, an unknown GPU, an unreadable file. The CLI
turns it into one line on stderr and exit status 2 (see ``tflabench.cli.user_errors``).
"""


class UserError(ValueError):
    """Bad input that the user can fix; the message is one line naming what and how."""
