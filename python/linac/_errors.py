"""The exceptions linac raises. Every one is a LinacError; each also derives from the builtin a caller
would catch for that kind of mistake (ValueError for a bad call, RuntimeError for a missing GPU or a bug).

    LinacError
    |-- LibraryNotFoundError (ImportError)  liblinac.so missing, unloadable, or of another ABI version
    |-- InvalidCallError (ValueError)       LINAC_ERROR_INVALID, or the same mistake caught in Python:
    |   |                                   device mix, dtype, shape, layout, option
    |   `-- UnsupportedError (NotImplementedError)  an argument (of fla's signature) linac does not implement
    |-- NoGpuError (RuntimeError)           LINAC_ERROR_NO_GPU: CUDA tensors but no usable driver/device
    `-- InternalError (RuntimeError)        LINAC_ERROR_INTERNAL: a bug in linac
"""


class LinacError(Exception):
    """Base of every error linac raises."""


class LibraryNotFoundError(LinacError, ImportError):
    """liblinac.so could not be found or loaded, or has another C ABI version."""


class InvalidCallError(LinacError, ValueError):
    """A mistake in the call (the message says which): LINAC_ERROR_INVALID."""


class UnsupportedError(InvalidCallError, NotImplementedError):
    """An argument or combination linac does not implement (e.g. fla's reverse=True)."""


class NoGpuError(LinacError, RuntimeError):
    """CUDA tensors were given but linac found no usable GPU: LINAC_ERROR_NO_GPU."""


class InternalError(LinacError, RuntimeError):
    """A bug in linac: LINAC_ERROR_INTERNAL."""
