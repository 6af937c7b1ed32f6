"""numarun's version: one place, read by the package, the ``--version`` flags and packaging."""

__version__ = "0.1.0"
