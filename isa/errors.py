"""The project's own error types. Every user-facing error is an `LpuError`: the command line
prints its message on one line and exits with code 2. Anything else is an internal error."""


class LpuError(Exception):
    """A user error: bad source, bad config, bad binary, bad inputs, or a program that does not fit."""

    def __init__(self, message: str, **info):
        super().__init__(message)
        self.message = message
        self.info = info  # extra fields for --json (e.g. bytes_needed, chips_needed)

    def __str__(self):
        return self.message


class ConfigError(LpuError):
    """A machine or GPU configuration file is missing a field or has an invalid one."""


class BinaryError(LpuError):
    """A .lpubin file is corrupt, truncated, of another version, or built for another machine."""


class AsmError(LpuError):
    """An assembly text file has an error (reported with file:line)."""


class CapacityError(LpuError):
    """A program does not fit the machine (info: bytes_needed, bytes_available, chips_needed)."""


class UnsupportedError(LpuError):
    """A construct the back end cannot lower (reported at its source line)."""
