"""numarun: start one worker per GPU or CPU slice, bound near its device, and supervise them."""

__version__ = "0.1.0"
